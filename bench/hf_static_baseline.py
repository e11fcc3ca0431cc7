#!/usr/bin/env python3
"""Hugging Face transformers' static batching: the baseline troupe-gpu-bench answers.

Builds a Llama model of the same shape as troupe-gpu-bench's (random BF16 weights,
made on the GPU, no download) and runs the same Anyscale-style workload that
troupe-gpu-bench wrote (--workload): padded batches through `generate`, each batch
running until its longest request is done, as static batching does. Throughput
counts each request's own output tokens only. Prints one JSON line.

Needs python3 with torch and transformers (the GPU machine has both).
"""

import argparse
import json
import sys
import time

# The shapes troupe-gpu-bench makes. RoPE's base is left at the default: with random weights
# it changes no timing, and transformers moved where it is set between versions.
SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                      max_position_embeddings=8192),
    "llama-110m": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, intermediate_size=2048,
                       max_position_embeddings=2048),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="the JSON troupe-gpu-bench wrote")
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=0,
                        help="run the workload's first N requests only (0: all)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()

    begun = time.perf_counter()

    def progress(what):  # to stderr as it happens, so a run cut short says how far it got
        print(f"[{time.perf_counter() - begun:6.1f} s] {what}", file=sys.stderr, flush=True)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    progress("imported torch and transformers")

    with open(args.workload) as f:
        workload = json.load(f)
    output_lens = workload["output_lens"]
    if args.num_prompts > 0:
        output_lens = output_lens[: args.num_prompts]
    input_len = int(workload["input_len"])

    # No end-of-sequence token: every request runs to its own length, as in troupe's run
    # (ignore_eos), and a static batch runs to its longest.
    config = LlamaConfig(**SHAPES[args.shape], tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(int(workload.get("seed", 0)))
    torch.set_default_dtype(torch.bfloat16)
    started = time.perf_counter()
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model.eval()
    build_s = time.perf_counter() - started
    progress(f"built the model on the GPU in {build_s:.1f} s")
    generator = torch.Generator(device="cuda").manual_seed(1)

    def run_batch(lens):
        prompts = torch.randint(3, config.vocab_size, (len(lens), input_len),
                                device="cuda", generator=generator)
        attention = torch.ones_like(prompts)
        with torch.no_grad():
            model.generate(input_ids=prompts, attention_mask=attention,
                           max_new_tokens=max(lens), do_sample=True, temperature=1.0,
                           top_k=0, top_p=1.0, pad_token_id=0)

    run_batch([8] * min(len(output_lens), args.batch_size))  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    progress("warmed up")
    started = time.perf_counter()
    for i in range(0, len(output_lens), args.batch_size):
        batch = output_lens[i: i + args.batch_size]
        run_batch(batch)
        torch.cuda.synchronize()
        progress(f"batch of {len(batch)} requests, {max(batch)} steps, done")
    seconds = time.perf_counter() - started

    output_tokens = sum(output_lens)
    result = {
        "baseline": "transformers static batching",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "shape": args.shape,
        "batch_size": args.batch_size,
        "requests": len(output_lens),
        "input_len": input_len,
        "output_tokens": output_tokens,
        "seconds": seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "total_tokens_per_s": (output_tokens + input_len * len(output_lens)) / seconds,
        "model_build_s": build_s,
    }
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
