"""Set lm-eval's two runs of run.sh side by side: per task its metric, and per loglikelihood request the two
log-likelihoods (Calispec's HTTP API against lm-eval's in-process Hugging Face backend on the same weights); per
generation, the texts (Calispec's default mode, csd, and sd).

    python compare.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def samples(run: Path, task: str) -> dict[int, dict]:
    (path,) = run.rglob(f"samples_{task}_*.jsonl")
    return {s["doc_id"]: s for s in map(json.loads, path.read_text().splitlines())}


def main(out: Path) -> None:
    for task, metric in (("calispec_mc", "acc"), ("calispec_gen", "exact_match")):
        ours, theirs = samples(out / "calispec", task), samples(out / "hf", task)
        assert ours.keys() == theirs.keys()
        score = {
            name: sum(s[metric] for s in run.values()) / len(run) for name, run in (("calispec", ours), ("hf", theirs))
        }
        same = sum(ours[d][metric] == theirs[d][metric] for d in ours)
        print(
            f"{task}: {metric} calispec {score['calispec']:.3f}, hf {score['hf']:.3f}; "
            f"same per document {same}/{len(ours)}"
        )
        if task == "calispec_mc":
            diffs = [
                abs(float(a[0]) - float(b[0]))
                for d in ours
                for a, b in zip(ours[d]["filtered_resps"], theirs[d]["filtered_resps"], strict=True)
            ]
            picks = sum(
                max(range(len(o)), key=lambda i: float(o[i][0])) == max(range(len(t)), key=lambda i: float(t[i][0]))
                for o, t in ((ours[d]["filtered_resps"], theirs[d]["filtered_resps"]) for d in ours)
            )
            print(
                f"  {len(diffs)} loglikelihoods: largest |difference| {max(diffs):.2e}, "
                f"mean {sum(diffs) / len(diffs):.2e}; same choice {picks}/{len(ours)}"
            )
        else:
            lossless = samples(out / "calispec-sd", task)
            for mode, run in (("csd (the default)", ours), ("sd", lossless)):
                same_text = sum(run[d]["filtered_resps"] == theirs[d]["filtered_resps"] for d in run)
                print(f"  {mode}: same generated text as hf {same_text}/{len(run)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
