"""bench/gpu_check.py's report: every case's row and the goal figures beside them, written
as JSON and markdown into the check's folder after every case (a check cut off anywhere
leaves what it measured so far)."""

from __future__ import annotations

import json
from pathlib import Path

# the goals the figures are held to (bench/README.md, issue 48)
FUSED_LENET_GOAL = {"H200": 2_000_000, "H100": 1_600_000}  # images/s, best fused lenet pack
RESNET18_FUSED_GOAL = 3.0  # resnet18 fused / one at a time
STEP_GOAL = 0.95  # the engine's step / the hand-written loop, in both modes


def fused_lenet_goal(device: str) -> int | None:
    return next((v for k, v in FUSED_LENET_GOAL.items() if k in device), None)


def verdict(value, goal, smoke: bool) -> str:
    if smoke:
        return "not applicable (CPU smoke)"
    if value is None:
        return "unmeasured"
    if goal is None:
        return "no goal for this device"
    return "met" if value >= goal else "missed"


class Report:
    """The header, the rows so far, and what could not be measured; ``add`` writes all."""

    def __init__(self, out: Path, header: dict, missing: list[str]):
        self.out, self.header, self.missing, self.rows = out, header, missing, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        shown = {k: v for k, v in row.items() if k not in ("error", "tests")}
        print(json.dumps(shown), flush=True)
        self.write()

    SMOKE_NO_RATIO = ("CPU smoke: no ratios. Its runs train 2 or 3 steps an epoch, so each "
                      "figure is mostly the per-epoch work around the steps (and this box's "
                      "load): the figures show that each command runs, not how fast")

    def with_ratios(self) -> list[dict]:
        """Each sweep figure against one at a time of its model (none in the smoke)."""
        if self.header["smoke"]:
            return self.rows
        alone = {r["model"]: r["images_per_sec"] for r in self.rows
                 if r.get("kind") == "alone" and r.get("images_per_sec")}
        for r in self.rows:
            if r.get("kind") not in (None, "alone") and r.get("model") in alone \
                    and r.get("images_per_sec"):
                r["vs_alone"] = round(r["images_per_sec"] / alone[r["model"]], 2)
        return self.rows

    def goals(self) -> list[dict]:
        smoke, device = self.header["smoke"], self.header["device"]
        rows = self.with_ratios()
        fused = [r for r in rows if r.get("model") == "lenet" and r.get("kind") == "fused"
                 and r.get("images_per_sec")]
        best = max(fused, key=lambda r: r["images_per_sec"], default=None)
        lenet_goal = fused_lenet_goal(device)
        resnet = next((r for r in rows if r.get("model") == "resnet18"
                       and r.get("kind") == "fused" and "vs_alone" in r), None)
        goals = [{"goal": "fused lenet images/s (best of K = 16 and 64, shared or own batches)",
                  "target": (f">= {lenet_goal:,}" if lenet_goal else
                             ">= 2,000,000 on an H200, 1,600,000 on an H100"),
                  "measured": best and best["images_per_sec"], "case": best and best["case"],
                  "verdict": verdict(best and best["images_per_sec"], lenet_goal, smoke)},
                 {"goal": "resnet18 fused / one at a time", "target": f">= {RESNET18_FUSED_GOAL}x",
                  "measured": resnet and resnet["vs_alone"], "case": resnet and resnet["case"],
                  "verdict": verdict(resnet and resnet["vs_alone"], RESNET18_FUSED_GOAL, smoke)}]
        for mode in ("deterministic", "nondeterministic"):
            step = next((r for r in rows if r.get("step_mode") == mode
                         and r.get("vs_hand_written")), None)
            goals.append({"goal": f"engine step / hand-written loop, {mode}",
                          "target": f">= {STEP_GOAL}x",
                          "measured": step and step["vs_hand_written"],
                          "case": step and step["case"],
                          "verdict": verdict(step and step["vs_hand_written"], STEP_GOAL, smoke)})
        return goals

    def goal_lines(self, goals: list[dict]) -> list[str]:
        lines = ["| goal | target | measured | case | verdict |",
                 "| --- | --- | ---: | --- | --- |"]
        for g in goals:
            measured = g["measured"]
            shown = "" if measured is None else (f"{measured:,}" if measured > 100
                                                 else f"{measured}x")
            lines.append(f"| {g['goal']} | {g['target']} | {shown} | {g['case'] or ''} | "
                         f"{g['verdict']} |")
        return lines

    def goals_text(self) -> str:
        """The goals table, each figure against its goal, for standard output."""
        h = self.header
        return "\n".join([f"goals: {h['device']}, torch {h['torch']}", "",
                          *self.goal_lines(self.goals()),
                          *(["", self.SMOKE_NO_RATIO + "."] if h["smoke"] else [])])

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        goals = self.goals()
        (self.out / "gpu_check.json").write_text(json.dumps(
            {**self.header, "missing": self.missing, "goals": goals, "rows": self.rows},
            indent=1) + "\n")
        h = self.header
        lines = [f"# gpu_check: {h['device']}, torch {h['torch']}, budget {h['budget_s']:.0f} s",
                 "", *self.goal_lines(goals)]
        lines += ["", "| stage | case | result | images/s | vs alone | GPU util | wall s | ran |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in self.rows:
            ips = f"{r['images_per_sec']:,.0f}" if r.get("images_per_sec") else ""
            ratio = r.get("vs_alone") or r.get("vs_hand_written") or ""
            util = (f"{r['gpu_util_mean_pct']:.0f} %" if r.get("gpu_util_mean_pct") is not None
                    else "")
            result = " ".join(str(r["result"]).split()).replace("|", "/")
            lines.append(f"| {r['stage']} | {r['case']} | {result} | {ips} | "
                         f"{f'{ratio}x' if ratio else ''} | {util} | {r.get('wall_s', 0):.0f} | "
                         f"{r.get('ran', '')} |")
        if h["smoke"]:
            lines += ["", self.SMOKE_NO_RATIO + "."]
        if self.missing:
            lines += ["", "Could not be measured here:", ""] + [f"- {m}" for m in self.missing]
        for r in self.rows:
            if r.get("tests"):
                lines += ["", f"Tests ({r['case']}):", ""] + [
                    f"- {t['test']}: {t['outcome']}" + (f" ({t['reason']})" if t["reason"] else "")
                    for t in r["tests"]]
        (self.out / "gpu_check.md").write_text("\n".join(lines) + "\n")
