"""The benchmarks' start barrier: a process waits for the others' pids in the folder, and
goes on alone, saying so, when they do not come within its bound; unset, nothing."""

from cifarflow.engine import start_barrier


def test_a_process_waits_for_the_others_and_goes_on_alone_past_the_bound(tmp_path, monkeypatch):
    said = []
    assert start_barrier.wait(said.append, environ={}) is None
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1").write_text("")  # another replica is there already
    env = {start_barrier.START_BARRIER: f"{tmp_path / 'a'}:2"}
    assert start_barrier.wait(said.append, environ=env) < 1 and said == []
    monkeypatch.setattr(start_barrier, "WAIT_S", 0.2)
    env = {start_barrier.START_BARRIER: f"{tmp_path / 'b'}:3"}
    assert start_barrier.wait(said.append, environ=env) >= 0.2
    assert said == ["start barrier: 1 of 3 processes after 0.2 s; going on alone"]
