#!/usr/bin/env python3
"""Records a trace of PyTorch eager running a Hugging Face transformers model on a GGUF file, under
torch.profiler (Kineto's Chrome trace), for `opledger import --rules pytorch`.

    record.py MODEL.gguf TRACE.json.gz [--tokens 128] [--steps 3] [--threads 2]

transformers loads the GGUF file itself (`gguf_file=`, weights dequantised to float32). Each pass
is a prefill of the same chunk from position 0 with a fresh KV cache, the logits of the last
token only (`logits_to_keep=1`), as `opledger profile -p N` computes it with llama.cpp; the
tokens are opledger's filler tokens (crates/core/src/tokens.rs: SplitMix64, seed 0, over the
file's vocabulary), so both engines see the same ids. The first pass is a warm-up and is
traced too (`opledger import --skip-steps 1`). The profiler records CPU activity with shapes
and Python stacks (`with_stack=True` gives one `python_function` span per module call, named
"nn.Module: <Class>_<n>", which the import rules read; `with_modules` is TorchScript's only) and marks every pass `ProfilerStep#N`
through its schedule (`prof.step()`). Nothing here names a band: the spans are torch's own.
"""

import argparse
import os
import sys
import time

MASK = (1 << 64) - 1


def splitmix64(x):
    """opledger's core::tokens::splitmix64."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def filler_tokens(seed, start, n, vocab):
    """opledger's core::tokens::filler_tokens: position p gets splitmix64(seed ^ p * golden) % vocab."""
    vocab = max(vocab, 1)
    return [splitmix64(seed ^ ((p * 0x9E3779B97F4A7C15) & MASK)) % vocab for p in range(start, start + n)]


def vocab_size(path):
    """The vocabulary llama.cpp reads (llama_vocab_n_tokens): the GGUF's token list."""
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        sys.exit(f"{path}: no tokenizer.ggml.tokens: the vocabulary size is unknown")
    return len(field.data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="the GGUF file")
    ap.add_argument("trace", help="the trace to write (.json, or .json.gz: gzip)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3, help="measured passes after the warm-up")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.tokens < 1 or a.steps < 1 or a.threads < 1:
        sys.exit("--tokens, --steps and --threads must be at least 1")

    import torch
    import tqdm
    from transformers import AutoModelForCausalLM

    # no progress-bar monitor thread: its waits would be spans of another thread in the trace
    tqdm.tqdm.monitor_interval = 0

    torch.set_num_threads(a.threads)
    vocab = vocab_size(a.model)
    ids = torch.tensor([filler_tokens(0, 0, a.tokens, vocab)], dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(a.model)),
        gguf_file=os.path.basename(a.model),
        dtype=torch.float32,
    )
    model.eval()
    passes = 1 + a.steps
    activities = [torch.profiler.ProfilerActivity.CPU]
    schedule = torch.profiler.schedule(wait=0, warmup=0, active=passes, repeat=1)
    walls = []
    with torch.no_grad(), torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        on_trace_ready=lambda p: p.export_chrome_trace(a.trace),
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for _ in range(passes):
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            walls.append(time.perf_counter() - t0)
            prof.step()
    print(
        f"{a.trace}: {type(model).__name__} ({model.config.model_type}), a warm-up and {a.steps} "
        f"passes of {a.tokens} tokens, {a.threads} threads, vocabulary {vocab}; torch "
        f"{torch.__version__}; pass walls (s): {', '.join(f'{w:.3f}' for w in walls)}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
