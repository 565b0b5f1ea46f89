"""Pretrain the bundled tiny Llama (hf_rope_ext/bundled/tiny-llama-stdlib) on the Python standard library's source.

Seeded and deterministic for a given device: the file list is fixed in hf_rope_ext/bundled/corpus_files.txt, the
training stream is the train split's UTF-8 bytes (ByT5 ids = byte + 3, documents separated by </s>), cut into
--seq-len windows and shuffled with --seed. AdamW with linear warm-up and cosine decay over --max-steps; the run
also stops at --deadline (UTC, HH:MM) and saves a usable checkpoint every --save-every steps, so a cut-short run
still leaves a model (its card records where it stopped).

    OMP_NUM_THREADS=2 python scripts/pretrain_tiny_llama.py --max-steps 3000 --deadline 21:05
    python scripts/pretrain_tiny_llama.py --device cuda --max-steps 3000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

from hf_rope_ext import bundled

BYTE_OFFSET = 3  # ByT5: 0 <pad>, 1 </s>, 2 <unk>, then the 256 byte values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=bundled.BUNDLED_DIR / bundled.MODEL_NAME)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--deadline", default=None, help="UTC wall-clock HH:MM at which to stop and save")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-seqs", type=int, default=32, help="held-out windows scored at each save")
    return p.parse_args(argv)


def model_config(seq_len: int, vocab_size: int) -> LlamaConfig:
    """About 3.3M parameters: 4 layers, 4 heads of 64, SwiGLU 688, tied byte embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=1,
    )


def token_stream(split: str) -> np.ndarray:
    """Every document of ``split`` as one stream of ByT5 ids; shape (n_tokens,), int64."""
    return token_stream_of(bundled.read_documents(bundled.corpus_files(split)))


def token_stream_of(docs: list[str]) -> np.ndarray:
    """The documents' UTF-8 bytes + 3 (ByT5 ids), each followed by </s> (1); shape (n_tokens,), int64."""
    ids = [np.frombuffer(d.encode("utf-8"), dtype=np.uint8).astype(np.int64) + BYTE_OFFSET for d in docs]
    eos = np.ones(1, dtype=np.int64)
    return np.concatenate([x for doc in ids for x in (doc, eos)])


def windows(stream: np.ndarray, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of the stream; shape (n_windows, seq_len)."""
    n = len(stream) // seq_len
    return torch.from_numpy(stream[: n * seq_len].reshape(n, seq_len))


def lr_at(step: int, args) -> float:
    """Linear warm-up to --lr, then cosine decay to 10% of it at --max-steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.max_steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_order(n_windows: int, steps: int, batch: int, seed: int) -> torch.Tensor:
    """Window indices for every step, epoch after epoch, each epoch a seeded permutation; shape (steps, batch)."""
    gen = torch.Generator().manual_seed(seed)
    epochs = math.ceil(steps * batch / n_windows)
    order = torch.cat([torch.randperm(n_windows, generator=gen) for _ in range(epochs)])
    return order[: steps * batch].view(steps, batch)


@torch.no_grad()
def held_out_loss(model, eval_windows: torch.Tensor, device: str) -> float:
    model.eval()
    losses = [model(input_ids=w[None].to(device), labels=w[None].to(device)).loss.item() for w in eval_windows]
    model.train()
    return float(np.mean(losses))


def deadline_ts(text: str | None) -> float:
    if text is None:
        return math.inf
    now = dt.datetime.now(dt.timezone.utc)
    hh, mm = (int(x) for x in text.split(":"))
    target = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    return target.timestamp() if target > now else (target + dt.timedelta(days=1)).timestamp()


def save(model, tokenizer, out: Path, summary: dict, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(model_card(summary))


def model_card(s: dict) -> str:
    lines = [
        "---",
        "license: mit",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [llama, rope, byte-level, tiny, hf-rope-ext]",
        "---",
        "# tiny-llama-stdlib",
        "",
        "A tiny Llama pretrained by `hf-rope-ext` on the Python standard library's source, shipped as the",
        "package's default model for context-extension demos (`hf-rope-ext extend`). Not useful for anything else.",
        "",
        "| | |",
        "| --- | --- |",
        f"| parameters | {s['parameters']:,} (4 layers, hidden 256, 4 heads x 64, SwiGLU 688, tied embeddings) |",
        "| tokenizer | `ByT5Tokenizer` (UTF-8 bytes + 3 specials, vocabulary 384) |",
        f"| context (pretraining length) | {s['seq_len']} tokens, RoPE theta 10000, half-rotate layout |",
        f"| corpus | Python {s['python']} stdlib `.py` files, {s['train_files']} train / {s['eval_files']} eval "
        f"(split by file, list in `corpus_files.txt`), {s['train_tokens']:,} train tokens |",
        f"| steps | {s['step']} of {s['max_steps']} planned, batch {s['batch_size']} x {s['seq_len']} |",
        f"| tokens seen | {s['tokens_seen']:,} ({s['tokens_seen'] / s['train_tokens']:.2f} epochs) |",
        f"| optimizer | AdamW lr {s['lr']}, warm-up {s['warmup']}, cosine to 10%, weight decay {s['weight_decay']}, "
        "fp32 |",
        f"| final train loss (last {s['log_every']} steps) | {s['train_loss']:.4f} nats/token |",
        f"| held-out loss ({s['eval_seqs']} eval-split windows of {s['seq_len']}) | {s['eval_loss']:.4f} "
        f"nats/token (perplexity {math.exp(s['eval_loss']):.3f}) |",
        f"| hardware / time | {s['device']}, {s['elapsed_s'] / 60:.1f} min |",
        "",
        "Reproduce (same device type gives the same weights):",
        "",
        "```bash",
        s["command"],
        "```",
        "",
        "Reading beyond 512 tokens needs a RoPE scaling method; see `hf-rope-ext extend`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    stop_at = deadline_ts(args.deadline)
    tokenizer = ByT5Tokenizer()
    train = windows(token_stream("train"), args.seq_len)
    eval_w = windows(token_stream("eval"), args.seq_len)
    eval_w = eval_w[torch.linspace(0, len(eval_w) - 1, args.eval_seqs).long()]
    model = LlamaForCausalLM(model_config(args.seq_len, len(tokenizer))).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    order = batch_order(len(train), args.max_steps, args.batch_size, args.seed)
    summary = {
        "parameters": n_params,
        "python": platform.python_version(),
        "train_files": len(bundled.corpus_files("train")),
        "eval_files": len(bundled.corpus_files("eval")),
        "train_tokens": int(train.numel()),
        "command": "OMP_NUM_THREADS=2 PYTHONPATH=. python "
        + " ".join(["scripts/pretrain_tiny_llama.py", *sys.argv[1:]]),
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    print(f"params {n_params:,}  train windows {len(train)}  eval windows {len(eval_w)}", flush=True)
    start, recent = time.time(), []
    model.train()
    for step in range(args.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        batch = train[order[step]].to(args.device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = (recent + [loss.item()])[-args.log_every :]
        done = step + 1
        out_of_time = time.time() >= stop_at
        if done % args.log_every == 0:
            rate = done * args.batch_size * args.seq_len / (time.time() - start)
            print(f"step {done} loss {np.mean(recent):.4f} lr {lr_at(step, args):.2e} tok/s {rate:.0f}", flush=True)
        if done % args.save_every == 0 or done == args.max_steps or out_of_time:
            summary.update(
                step=done,
                tokens_seen=done * args.batch_size * args.seq_len,
                train_loss=float(np.mean(recent)),
                eval_loss=held_out_loss(model, eval_w, args.device),
                elapsed_s=time.time() - start,
            )
            save(model, tokenizer, args.out, summary, args)
            print(f"saved step {done}: eval loss {summary['eval_loss']:.4f}", flush=True)
        if out_of_time:
            print("deadline reached, stopping", flush=True)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
