"""Pretrain the bundled tiny Llama (hf_rope_ext/store/bundled/tiny-llama-stdlib) on the Python standard library's source
mixed with synthetic long-range tasks that teach it to read its whole context.

Seeded and deterministic for a given device: the file list is fixed in hf_rope_ext/store/bundled/corpus_files.txt, the
code stream is the train split's UTF-8 bytes (ByT5 ids = byte + 3, documents separated by </s>), cut into
--seq-len windows and shuffled with --seed. With --synthetic P, a fraction P of every batch's rows is replaced by
synthetic windows (seeded per step): a pass key planted in filler (sentences or code) and asked for at the end,
key-value lookups (a table of random digit pairs, then queries), code windows with a span copied further on,
and code with a random string planted several times.
Retrieval needs only induction (copy) heads; these tasks give them a dense signal. --short-len/--short-steps run
the first steps at a shorter length (a curriculum); --init-from warm-starts from a saved model of the same shape.
AdamW with linear warm-up and cosine decay over --max-steps; the run
also stops at --deadline (UTC, HH:MM) and saves a usable checkpoint every --save-every steps, so a cut-short run
still leaves a model (its card records where it stopped).

    OMP_NUM_THREADS=2 python experiments/pretrain_tiny_llama.py --max-steps 3000 --deadline 21:05
    python experiments/pretrain_tiny_llama.py --device cuda --max-steps 3000
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
import torch.nn.functional as F
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

from hf_rope_ext.store import bundled

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
    p.add_argument("--synthetic", type=float, default=0.0, help="fraction of each batch that is synthetic tasks")
    p.add_argument("--short-len", type=int, default=None, help="sequence length of the first --short-steps steps")
    p.add_argument("--short-steps", type=int, default=0)
    p.add_argument("--long-every", type=int, default=10**9, help="during --short-steps, every n-th step at full length")
    p.add_argument("--init-from", type=Path, default=None, help="warm-start from this saved model (same shape)")
    p.add_argument("--retrieval-weight", type=float, default=1.0, help="weight of the synthetic rows' target loss")
    p.add_argument("--passkey-keys", type=int, default=8, help="pass keys (depths 0..1) scored at 1x at each save")
    p.add_argument(
        "--drill", default=None, help="copy-drill phases first, 'lr:steps,lr:steps' (e.g. 1e-3:300,2e-3:800)"
    )
    p.add_argument("--drill-len", type=int, default=128, help="sequence length of the copy drill")
    p.add_argument("--drill-batch", type=int, default=16, help="batch size of the copy drill")
    args = p.parse_args(argv)
    drill_phases(args.drill)  # a malformed --drill stops here, before any loading
    return args


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


# --- synthetic long-range tasks --------------------------------------------------------------------------------
PASSKEY_FORMS = (  # (needle, question); the first is the evaluation's wording
    (" The pass key is {key}. Remember it. {key} is the pass key.", " What is the pass key? The pass key is"),
    (" The secret number is {key}. Keep it in mind.", " What is the secret number? The secret number is"),
    ("\n# code: {key}\n", "\n# What was the code? The code is"),
)
TASK_LINE = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
SENTENCES = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
)


def ids_of(text: str) -> np.ndarray:
    """ByT5 ids of ``text`` (UTF-8 bytes + 3); shape (n,), int64."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + BYTE_OFFSET


def filler(rng: np.random.Generator, code: np.ndarray, n: int) -> np.ndarray:
    """``n`` filler ids: the evaluation's sentences cycled from a random one, or a random stretch of code."""
    if rng.random() < 0.5:
        order = rng.permutation(len(SENTENCES)) if rng.random() < 0.5 else np.arange(len(SENTENCES))
        cycle = np.concatenate([ids_of(SENTENCES[i]) for i in order])
        reps = np.tile(cycle, n // len(cycle) + 2)
        start = rng.integers(len(cycle))
        return reps[start : start + n]
    start = rng.integers(len(code) - n)
    return code[start : start + n]


def passkey_window(rng: np.random.Generator, code: np.ndarray, length: int):
    """[task line?][filler .. needle .. filler][question][ " key"]: exactly ``length`` ids, the key 3-7 digits.
    Returns (ids, targets): targets marks the answer's digits, the ids only retrieval predicts; both (length,)."""
    key = str(rng.integers(10 ** (digits := rng.integers(3, 8)) // 10, 10**digits))
    needle, question = PASSKEY_FORMS[rng.choice(3, p=[0.6, 0.25, 0.15])]
    head = ids_of(TASK_LINE) if rng.random() < 0.5 and length >= 400 else ids_of("")
    parts = [ids_of(needle.format(key=key)), ids_of(question), ids_of(" " + key)]
    n_fill = length - len(head) - sum(len(x) for x in parts)
    fill = filler(rng, code, n_fill)
    cut = rng.integers(n_fill + 1)
    ids = np.concatenate([head, fill[:cut], parts[0], fill[cut:], *parts[1:]])
    targets = np.zeros(length, dtype=bool)
    targets[length - len(key) :] = True
    return ids, targets


def lookup_window(rng: np.random.Generator, length: int):
    """Key-value lookup: "kkk=vvvvv;" pairs, a newline, then "kkk=vvvvv;" queries of earlier pairs, to ``length``.
    Targets: the queries' values."""
    n_pairs = int(length * rng.uniform(0.3, 0.6)) // 10
    keys = rng.choice(900, n_pairs, replace=False) + 100
    values = rng.integers(10000, 100000, n_pairs)
    pairs = [f"{k}={v};" for k, v in zip(keys, values, strict=True)]
    table = ids_of("".join(pairs) + "\n")
    queries = ids_of("".join(pairs[i] for i in rng.integers(n_pairs, size=length // 10 + 1)))
    in_value = np.tile(np.array([False] * 4 + [True] * 5 + [False]), len(queries) // 10)  # "kkk=" vvvvv ";"
    targets = np.concatenate([np.zeros(len(table), dtype=bool), in_value])
    return np.concatenate([table, queries])[:length], targets[:length]


def copy_window(rng: np.random.Generator, code: np.ndarray, length: int):
    """A code window with a 16-128 id span (at most a quarter of ``length``) of its first half copied to a random
    later place. Targets: the copy after its first id."""
    start = rng.integers(len(code) - length)
    w = code[start : start + length].copy()
    span = int(rng.integers(16, min(129, length // 4)))
    src = int(rng.integers(0, length // 2 - span + 1))
    dst = int(rng.integers(src + span, length - span + 1))
    w[dst : dst + span] = w[src : src + span]
    targets = np.zeros(length, dtype=bool)
    targets[dst + 1 : dst + span] = True
    return w, targets


PRINTABLE = np.arange(33, 127, dtype=np.int64) + BYTE_OFFSET  # ids of the printable ASCII bytes


def repeat_window(rng: np.random.Generator, code: np.ndarray, length: int):
    """Code with one random printable string (8-48 ids, at most length / 8) planted 3-6 times at random places:
    after its first occurrence, a string only induction (find the earlier copy, read what followed) can predict.
    Targets: the later occurrences after their first id."""
    start = rng.integers(len(code) - length)
    w = code[start : start + length].copy()
    k = int(rng.integers(8, min(49, length // 8 + 1)))
    planted = rng.choice(PRINTABLE, k)
    n = int(rng.integers(3, 7))
    slots = np.sort(rng.choice(length // k, n, replace=False)) * k  # non-overlapping places
    targets = np.zeros(length, dtype=bool)
    for i, at in enumerate(slots):
        w[at : at + k] = planted
        targets[at + 1 : at + k] = i > 0
    return w, targets


def drill_window(rng: np.random.Generator, length: int):
    """A random printable string of 8 to length/2 ids repeated to fill ``length`` ids: after the first copy every id is
    predictable only by induction (find the previous occurrence of the current id, read what followed it).
    Returns (ids, targets), both (length,); targets marks the ids after the first copy."""
    k = int(rng.integers(8, length // 2))
    ids = np.tile(rng.choice(PRINTABLE, k), length // k + 1)[:length]
    targets = np.zeros(length, dtype=bool)
    targets[k:] = True
    return ids, targets


TASKS = (  # (weight, builder(rng, code, length) -> (ids, targets))
    (0.3, passkey_window),
    (0.15, lambda rng, code, length: lookup_window(rng, length)),
    (0.2, copy_window),
    (0.35, repeat_window),
)


def synthetic_window(rng: np.random.Generator, code: np.ndarray, length: int):
    """One synthetic window, a task drawn with the TASKS weights: (ids, targets), both (length,); targets marks the
    ids that only retrieval from earlier in the window predicts."""
    kind = rng.choice(len(TASKS), p=[w for w, _ in TASKS])
    return TASKS[kind][1](rng, code, length)


def make_batch(train: torch.Tensor, rows: torch.Tensor, code: np.ndarray, step: int, length: int, args):
    """(batch, targets), both (batch_size, length): rows ``rows`` of the code windows cut to ``length``, the first
    round(--synthetic x batch size) replaced by seeded synthetic windows; targets is True on every id of a code row
    and on the retrieval targets of a synthetic row."""
    batch = train[rows][:, :length].clone()
    targets = torch.ones_like(batch, dtype=torch.bool)
    rng = np.random.default_rng([args.seed, step])
    for i in range(int(round(args.synthetic * len(batch)))):
        ids, marks = synthetic_window(rng, code, length)
        batch[i], targets[i] = torch.from_numpy(ids), torch.from_numpy(marks)
    return batch, targets


def mixture_loss(model, batch: torch.Tensor, targets: torch.Tensor, n_synthetic: int, weight: float):
    """(loss, code loss, retrieval loss): the mean next-id loss over the code rows plus ``weight`` x the mean over
    the synthetic rows' target ids (each task's tokens that only retrieval predicts). Without synthetic rows: the
    model's own loss, exactly as the shipped model was trained."""
    if n_synthetic == 0:
        loss = model(input_ids=batch, labels=batch).loss
        return loss, loss.item(), 0.0
    logits = model(input_ids=batch).logits[:, :-1]  # (batch, length - 1, vocab); position t predicts id t + 1
    losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # (batch, length - 1)
    marks = targets[:, 1:]
    code = losses[n_synthetic:].mean() if n_synthetic < len(batch) else losses.new_zeros(())
    retrieval = losses[:n_synthetic][marks[:n_synthetic]].mean() if n_synthetic else losses.new_zeros(())
    return code + weight * retrieval, code.item(), retrieval.item()


@torch.no_grad()
def passkey_at_1x(model, tokenizer, length: int, keys: int) -> float:
    """Teacher-forced passkey accuracy of the evaluation harness at ``length``, ``keys`` depths over [0, 1]."""
    from hf_rope_ext.eval.passkey import passkey_accuracy

    if keys <= 0:
        return float("nan")
    model.eval()
    acc = passkey_accuracy(model, tokenizer, length, depths=keys, generate=False, seed=123, progress=False)
    model.train()
    return acc["passkey_accuracy"]


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
        "A tiny Llama pretrained by `hf-rope-ext` on the Python standard library's source (and, where the table",
        "says so, synthetic retrieval tasks), shipped as the package's default model for context-extension demos",
        "(`hf-rope-ext extend`). Not useful for anything else.",
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
        *retrieval_rows(s),
        "",
        *reproduce_lines(s),
        "",
        "Reading beyond 512 tokens needs a RoPE scaling method; see `hf-rope-ext extend`.",
    ]
    return "\n".join(lines) + "\n"


def stages(s: dict) -> list[dict]:
    """The chain of runs that made this model, oldest first (each warm start's record is in its successor's)."""
    chain = []
    while s is not None:
        chain.append(s)
        s = s.get("init_from_training")
    return chain[::-1]


def retrieval_rows(s: dict) -> list[str]:
    """Card rows on the synthetic tasks, for a run that had them."""
    if "passkey_1x" not in s:
        return []
    drill = f"copy drill {s['drill']} (lr:steps), then " if s.get("drill") else ""
    return [
        f"| retrieval training | {drill}{s['synthetic']:.0%} synthetic rows per batch (pass keys, lookups, copies) |",
        f"| pass key at {s['seq_len']} tokens, unscaled | {s['passkey_1x']:.0%} of {s['passkey_keys']} keys, "
        "depths 0-100% |",
    ]


def reproduce_lines(s: dict) -> list[str]:
    """The commands that reproduce the model: one per run of its chain, in order."""
    chain = stages(s)
    lines = [
        "Reproduce (same device type gives the same weights):"
        if len(chain) == 1
        else f"Reproduce (same device type gives the same weights): {len(chain)} runs in order, each warm-starting "
        "from the one before (held-out loss and steps at the end of each):"
    ]
    lines += ["", "```bash"]
    for run in chain:
        if len(chain) > 1:
            lines.append(f"# {run['step']} of {run['max_steps']} steps, held-out loss {run['eval_loss']:.4f}")
        lines.append(run["command"])
    return lines + ["```"]


def build_model(args, vocab_size: int):
    """A fresh model of the bundled shape, or the --init-from model (warm start)."""
    if args.init_from is None:
        return LlamaForCausalLM(model_config(args.seq_len, vocab_size))
    return LlamaForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)


def init_training(path: Path | None) -> dict | None:
    """The warm start's own record (its command, steps, losses; not its history), so a chain of runs stays
    reproducible from the last model's training.json alone."""
    record = path / "training.json" if path is not None else None
    if record is None or not record.is_file():
        return None
    return {k: v for k, v in json.loads(record.read_text()).items() if k != "history"}


def make_optimizer(model, args) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )


def drill_phases(text: str | None) -> list[tuple[float, int]]:
    """'1e-3:300,2e-3:800' -> [(0.001, 300), (0.002, 800)]."""
    if not text:
        return []
    try:
        phases = [(float(lr), int(steps)) for lr, steps in (part.split(":") for part in text.split(","))]
    except ValueError:
        phases = []
    if not phases or any(lr <= 0 or steps < 1 for lr, steps in phases):
        raise SystemExit(f"--drill {text!r}: expected 'lr:steps,lr:steps' with lr > 0 and steps >= 1")
    return phases


def copy_drill(model, args) -> list[dict]:
    """The copy drill, before everything else: each --drill phase runs its steps at a constant lr with a fresh AdamW
    (no weight decay) on --drill-batch drill windows per step, drawn from a generator seeded with --seed (the same
    stream in every phase). Small models learn copying late and suddenly: warm-started from the code-only model with
    '1e-3:300,2e-3:800' the loss sat near chance (ln 94 = 4.5 nats) through the first phase and the first 500 steps
    of the second, then fell to 0.3 within 100 steps; a single phase at 2e-3 was still at 3.9 after 1,750 steps,
    and mixed batches (1,500 steps) never learned it. Returns one {"lr", "steps", "loss", "elapsed_s"} per phase."""
    done = []
    for lr, steps in drill_phases(args.drill):
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        rng, recent, start = np.random.default_rng(args.seed), [], time.time()
        for step in range(steps):
            ids, marks = zip(*(drill_window(rng, args.drill_len) for _ in range(args.drill_batch)), strict=True)
            batch = torch.from_numpy(np.stack(ids)).to(args.device)  # (drill_batch, drill_len)
            targets = torch.from_numpy(np.stack(marks)).to(args.device)
            loss, _, drill = mixture_loss(model, batch, targets, len(batch), 1.0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            recent = (recent + [drill])[-10:]
            if (step + 1) % args.log_every == 0:
                print(f"drill lr {lr:g} step {step + 1} copy loss {np.mean(recent):.4f}", flush=True)
        done.append({"lr": lr, "steps": steps, "loss": float(np.mean(recent)), "elapsed_s": time.time() - start})
    return done


def length_at(step: int, args) -> int:
    """--short-len for the first --short-steps steps, but every --long-every-th of them at --seq-len."""
    short = args.short_len and step < args.short_steps and (step + 1) % args.long_every != 0
    return args.short_len if short else args.seq_len


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    stop_at = deadline_ts(args.deadline)
    tokenizer = ByT5Tokenizer()
    code = token_stream("train")
    train = windows(code, args.seq_len)
    eval_w = windows(token_stream("eval"), args.seq_len)
    eval_w = eval_w[torch.linspace(0, len(eval_w) - 1, args.eval_seqs).long()]
    model = build_model(args, len(tokenizer)).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, args)
    order = batch_order(len(train), args.max_steps, args.batch_size, args.seed)
    summary = {
        "parameters": n_params,
        "python": platform.python_version(),
        "train_files": len(bundled.corpus_files("train")),
        "eval_files": len(bundled.corpus_files("eval")),
        "train_tokens": int(train.numel()),
        "command": "OMP_NUM_THREADS=1 PYTHONPATH=. python "
        + " ".join(["experiments/pretrain_tiny_llama.py", *sys.argv[1:]]),
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "history": [],
        "init_from_training": init_training(args.init_from),
    }
    print(f"params {n_params:,}  train windows {len(train)}  eval windows {len(eval_w)}", flush=True)
    if args.drill:
        summary["copy_drill"] = copy_drill(model, args)
        print(f"copy drill done: {summary['copy_drill']}", flush=True)
    start, recent, recent_retrieval, tokens = time.time(), [], [], 0
    model.train()
    for step in range(args.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        batch, targets = make_batch(train, order[step], code, step, length_at(step, args), args)
        n_syn = int(round(args.synthetic * len(batch)))
        loss, code_loss, retrieval_loss = mixture_loss(
            model, batch.to(args.device), targets.to(args.device), n_syn, args.retrieval_weight
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = (recent + [code_loss])[-args.log_every :]
        recent_retrieval = (recent_retrieval + [retrieval_loss])[-args.log_every :]
        tokens += batch.numel()
        done = step + 1
        out_of_time = time.time() >= stop_at
        if done % args.log_every == 0:
            rate = tokens / (time.time() - start)
            print(
                f"step {done} code loss {np.mean(recent):.4f} retrieval {np.mean(recent_retrieval):.4f} "
                f"lr {lr_at(step, args):.2e} tok/s {rate:.0f}",
                flush=True,
            )
        if done % args.save_every == 0 or done == args.max_steps or out_of_time:
            summary.update(
                step=done,
                tokens_seen=tokens,
                train_loss=float(np.mean(recent)),
                retrieval_loss=float(np.mean(recent_retrieval)),
                eval_loss=held_out_loss(model, eval_w, args.device),
                passkey_1x=passkey_at_1x(model, tokenizer, args.seq_len, args.passkey_keys),
                elapsed_s=time.time() - start,
            )
            summary["history"].append(
                {k: summary[k] for k in ("step", "eval_loss", "retrieval_loss", "passkey_1x", "elapsed_s")}
            )
            save(model, tokenizer, args.out, summary, args)
            print(
                f"saved step {done}: eval loss {summary['eval_loss']:.4f} passkey@1x {summary['passkey_1x']:.2f}",
                flush=True,
            )
        if out_of_time:
            print("deadline reached, stopping", flush=True)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
