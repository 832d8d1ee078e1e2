"""What the CPU computes natively (/proc/cpuinfo), and what amp: auto chooses from it."""

from cifarflow.engine.hardware import bf16_native, cpu_features

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""
COOPER_LAKE = "model name\t: Intel(R) Xeon(R) Gold 6348H\nflags\t: avx2 avx512f avx512_bf16\n"
CASCADE_LAKE = "model name\t: Intel(R) Xeon(R) Gold 6248\nflags\t: avx2 avx512f avx512_vnni\n"
ZEN2 = "model name\t: AMD EPYC 7502 32-Core Processor\nflags\t: avx2 sse4_2\n"


def test_cpu_features_from_cpuinfo():
    spr = cpu_features(SAPPHIRE_RAPIDS)
    assert spr["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert spr["flags"] == ["amx_bf16", "avx512_bf16", "amx_tile", "amx_int8", "avx512f", "avx2"]
    assert spr["bf16_native"]
    assert cpu_features(COOPER_LAKE)["bf16_native"]  # AVX512-BF16 without AMX
    assert cpu_features(CASCADE_LAKE) == {"model": "Intel(R) Xeon(R) Gold 6248",
                                          "flags": ["avx512f", "avx2"], "bf16_native": False}
    assert not cpu_features(ZEN2)["bf16_native"]


def test_auto_picks_bf16_only_where_it_is_native():
    assert bf16_native("cpu", cpu_features(SAPPHIRE_RAPIDS), None)
    assert not bf16_native("cpu", cpu_features(CASCADE_LAKE), None)
    assert bf16_native("cuda", {}, (8, 0)) and bf16_native("cuda", {}, (9, 0))
    assert not bf16_native("cuda", {}, (7, 0))  # V100: bf16 emulated
    assert not bf16_native("cuda", cpu_features(SAPPHIRE_RAPIDS), None)
    assert not bf16_native("mps", cpu_features(SAPPHIRE_RAPIDS), None)
