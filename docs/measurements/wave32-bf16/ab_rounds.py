"""Scratch (wave 32, docs/performance.md "Where a proposal stops"): `python ab_rounds.py LOG...`: over the requests of a
coordinator's DEBUG log that drafted, tokens/s over their rounds, acceptance, drafted and emitted tokens a drafting
round, then per prompt (requests in order, four prompts in turn): tok/s (target-only rounds / rounds). Requests run
at concurrency 1 only (every round of batch 1). Wave 33's lines carry the path floor too."""

import collections
import re
import sys
from pathlib import Path

PAT = re.compile(
    r"request (\S+) round: gamma (\d+) drafted (\d+) accepted (\d+) alpha \S+ (?:floor \S+ )?batch (\d+) "
    r"\| predicted \S+ ms, "
    r"measured (\S+) ms \(target forward (\S+), draft forwards ([0-9.]+)"
)
for path in sys.argv[1:]:
    requests = collections.defaultdict(list)
    for line in Path(path).read_text(errors="replace").splitlines():
        m = PAT.search(line)
        if m:
            requests[m[1]].append((int(m[2]), int(m[3]), int(m[4]), float(m[6]), float(m[8]), int(m[5])))
    speculative = [r for r in requests.values() if any(x[1] for x in r) and all(x[5] == 1 for x in r)]
    rounds = [x for r in speculative for x in r]
    drafted, accepted = sum(x[1] for x in rounds), sum(x[2] for x in rounds)
    ms, draft_ms = sum(x[3] for x in rounds), sum(x[4] for x in rounds)
    tokens = accepted + len(rounds)
    drafting = [x for x in rounds if x[1]]
    emitted = sum(x[2] for x in drafting) + len(drafting)
    print(
        f"{path.split('/')[-1]}: {len(speculative)} requests, rounds {len(rounds)} (drafting {len(drafting)}), "
        f"drafted {drafted} accepted {accepted} ({accepted / drafted:.3f}), tokens {tokens}, "
        f"{tokens / ms * 1e3:.2f} tok/s over rounds; drafted a drafting round {drafted / len(drafting):.2f}, "
        f"emitted {emitted / len(drafting):.2f}; draft ms a token {draft_ms / drafted:.1f}"
    )
    per_prompt = collections.defaultdict(list)
    for i, r in enumerate(speculative):
        per_prompt[i % 4].append(
            f"{(sum(x[2] for x in r) + len(r)) / sum(x[3] for x in r) * 1e3:.1f}"
            f"({sum(1 for x in r if not x[1])}/{len(r)})"
        )
    for k, v in sorted(per_prompt.items()):
        print("  prompt", k, " ".join(v))
