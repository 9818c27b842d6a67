import sys
from calispec_tools.bench.compare import CompareConfig, load_level
from calispec_tools.bench.pair import PROMPTS
from calispec_tools.models.registry import PAIRS, chat_prompt
texts = [t for k, ts in PROMPTS.items() for t in ts]
texts = [chat_prompt(PAIRS["qwen-coder"], texts[i % len(texts)]) for i in range(4)]
addrs = {"A": sys.argv[1], "B": sys.argv[2], "C": "127.0.0.1:52070"}
for spec in sys.argv[3].split(","):
    who, mode, *g = spec.split(":")
    cfg = CompareConfig(texts, 96, int(g[0]) if g else None, [8], int(__import__("os").environ.get("REQS", "16")))
    r = load_level(addrs[who], mode, 8, cfg)
    print(spec, "%.2f tok/s, full %.2f, acc %.3f" % (r["tokens_per_s"], r["full_concurrency_tokens_per_s"], r["acceptance"]), flush=True)
