"""Train a tiny GPT with the lmshard loader, on the CPU or a GPU, in one process or several
under torchrun, to show the loader in a real training loop. The loss should fall within a few
hundred steps.

The data comes from exactly one of:

    python scripts/train_tiny_gpt.py --input_file input.txt          # one text file, tokenized in memory
    python scripts/train_tiny_gpt.py --dataset_dir data/demo          # a dataset from `lmshard prepare`
    python scripts/train_tiny_gpt.py --mixture mix.toml               # several prepared datasets, weighted
    python scripts/train_tiny_gpt.py --data loader.toml               # a loader configuration file
    torchrun --nproc-per-node 2 scripts/train_tiny_gpt.py --dataset_dir data/demo   # data parallel, below

--input_file is for a start on small data: the file is read into memory and tokenized with the
gpt2 vocabulary (`TokenDataset.from_text`); its first 90% of tokens train and the last 10% are
held out for the val loss. When the data outgrows memory, prepare it once
(`lmshard prepare input.txt --out data/mine`) and pass --dataset_dir data/mine: the loop is the
same, and the dataset's own val split is used. A dataset directory may also be given without
the flag, as the first argument.

A mixture file names prepared datasets and their token weights (docs/loader.md, "Mixtures"):

    [[source]]
    path = "data/web"
    weight = 0.7
    [[source]]
    path = "data/code"
    weight = 0.3

The log then shows each source's target and observed share of the rows drawn so far (by all ranks).

A loader configuration file (`lmshard.load_config`, docs/loader.md) names the data (a dataset or
[[source]] tables), the sample shape and the seed; this script trains on its random or windows
samples, whose batch size and row length then come from the file (--batch-size, --seq-len and
--seed are not used). Packed and padded rows need a model that takes position_ids and masked labels.

Distributed: under torchrun (WORLD_SIZE > 1) every process joins a process group (NCCL with one
GPU per process, cuda:LOCAL_RANK; gloo on the CPU) and trains a DistributedDataParallel copy of
the model, whose gradients are averaged over the ranks at every step. The batch stream reads
RANK / WORLD_SIZE from the environment, so each rank draws its own --batch-size rows of every
global batch (batch size × world size rows per optimizer step). Only rank 0 logs, evaluates and
saves. --report FILE makes every rank write what it did, to check the run by: its parameters'
sha256 (equal on all ranks after a correct run) and the row offsets it drew.

Logging: a line every --log-every steps and at the last step (loss averaged over the ranks, val
loss, mixture shares), and between those a short one (rank 0's loss) when --progress-every
seconds (default 60) pass without a line, so a slow run still shows it is moving. Each line ends
with the tokens per second and the time left to --steps at this run's pace.

Schedules: --schedule FILE (TOML) ramps the batch size and the row length during the run,

    schedule = [[0, 8, 32], [100, 32, 32], [200, 32, 64]]    # [step, global batch, seq_len]

in row order: no row is skipped or repeated where the shape changes, and --resume continues at any
world size (docs/loader.md, "Schedules"). A --mixture file's curriculum (weights by token
position) is drawn the same way; the log shows each source's observed share against its weight now.

Resuming: the data position is `batches.state_dict()`, a handful of integers saved in the
checkpoint beside the model (see --save / --resume). --steps is the run's total (nanoGPT's
max_iters): a resumed run trains from its checkpoint's step up to it, and the learning-rate
schedule ends there too unless --lr-horizon says otherwise. This loop draws each batch just before it
trains on it, so no batch is in hand when it saves; a loop that draws the next batch ahead would
save `batches.state_dict(in_hand=1)` to have that batch handed out again after resuming.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lmshard import LmshardError, Mixture, TokenDataset
from lmshard.runtime import BatchStream
from lmshard.runtime.schedule import Schedule

VAL_FRACTION = 0.1  # of an --input_file's tokens, held out (its end) for the val loss


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied embeddings keep the model small
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)  # GPT-2's init: logits start near uniform

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        logits = self.head(self.ln(self.blocks(h)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


class Ranks:
    """This process's place in the run, from torchrun's RANK, LOCAL_RANK and WORLD_SIZE
    (rank 0 of 1 without torchrun)."""

    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0")) if self.world_size > 1 else 0
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.world_size > 1 else 0
        self.distributed = self.world_size > 1
        self.main = self.rank == 0


def setup_device(ranks: Ranks, device: str) -> torch.device:
    """The device this process trains on. Under torchrun, joins the process group first: NCCL and
    cuda:LOCAL_RANK for a CUDA device (one GPU per process), gloo otherwise."""
    dev = torch.device(device)
    if not ranks.distributed:
        return dev
    if dev.type == "cuda":
        dev = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(dev)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return dev


def params_sha256(model: nn.Module) -> str:
    """sha256 over every parameter's name, shape and raw bytes, in module order: two models hash
    alike exactly when their weights are bitwise equal."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def report_path(path: str, rank: int) -> Path:
    """FILE with -rank<R> before its extension: report.json → report-rank0.json."""
    p = Path(path)
    return p.with_name(f"{p.stem}-rank{rank}{p.suffix}")


@torch.no_grad()
def evaluate(model: nn.Module, val: BatchStream, steps: int = 4) -> float:
    model.eval()
    losses = [model(*next(val)).item() for _ in range(steps)]
    model.train()
    return sum(losses) / len(losses)


class Log:
    """Rank 0's log. `line` is called by every rank at the same steps (it averages the loss and
    sums the mixture's row counts over the ranks); `progress` prints a short line from rank 0
    when `every` seconds have passed since the last line. `clock` gives seconds."""

    def __init__(self, ranks: Ranks, start: int, tokens_before: Callable[[int], int], log_every: int, every: float,
                 mix: Mixture | None, clock: Callable[[], float] = time.perf_counter,
                 end: int = 0) -> None:  # fmt: skip
        # tokens_before(step): the run's tokens (all ranks) before a step, which a schedule changes step by step
        self.ranks, self.start, self.tokens_before, self.every, self.mix = ranks, start, tokens_before, every, mix
        self.end = end  # the run's last step + 1: the time left is estimated from this run's rate
        self.log_every, self.clock = log_every, clock
        self.t0 = self.last = clock()
        self.drawn = np.zeros(len(mix.names) if mix is not None else 0, dtype=np.int64)  # rows per source, this rank
        self.weights_now: Callable[[int], list[float]] | None = None  # a curriculum's weights at a step

    def count(self, offsets: np.ndarray) -> None:
        if self.mix is not None:
            self.drawn += np.bincount(self.mix.locate(offsets)[0], minlength=len(self.drawn))

    def _rate(self, step: int) -> str:
        self.last = self.clock()
        done, spent = step - self.start + 1, max(self.last - self.t0, 1e-9)
        left = max(0, self.end - step - 1) * spent / done
        eta = f"  ETA {int(left) // 3600}:{int(left) // 60 % 60:02d}:{int(left) % 60:02d}" if self.end else ""
        tokens = self.tokens_before(step + 1) - self.tokens_before(self.start)
        return f"{tokens / spent:,.0f} tok/s{eta}"

    def line(self, step: int, loss: torch.Tensor, model: nn.Module, val: BatchStream | None) -> None:
        # one float64 all-reduce: the loss and the row counts (exact as float64 below 2**53 rows)
        totals = torch.tensor([loss.item(), *self.drawn.tolist()], dtype=torch.float64, device=loss.device)
        if self.ranks.distributed:
            dist.all_reduce(totals)  # NCCL reduces CUDA tensors only, hence the loss's device
        totals = totals.cpu()
        if not self.ranks.main:
            return
        extra = f"  val {evaluate(model, val):.3f}" if val is not None else ""
        if self.mix is not None:
            shares = totals[1:].numpy() / totals[1:].sum().item()
            weights = self.mix.weights if self.weights_now is None else self.weights_now(step)
            extra += "  " + " ".join(
                f"{n}={o:.3f}/{w:.3f}" for n, o, w in zip(self.mix.names, shares, weights, strict=True)
            )
        mean = totals[0].item() / self.ranks.world_size
        print(f"step {step:5d}  loss {mean:.3f}{extra}  {self._rate(step)}", flush=True)

    def after(self, step: int, last: bool, loss: torch.Tensor, model: nn.Module, val: BatchStream | None) -> None:
        """After each optimizer step: the full line every log_every steps and at the last one, else
        a short line if one is due."""
        if step % self.log_every == 0 or last:
            self.line(step, loss, model, val)
        else:
            self.progress(step, loss)

    def progress(self, step: int, loss: torch.Tensor) -> None:
        if self.ranks.main and self.clock() - self.last >= self.every:
            print(f"step {step:5d}  loss {loss.item():.3f}  {self._rate(step)}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = ap.add_argument_group("data (exactly one)")
    data.add_argument("--input_file", "--input-file", metavar="FILE",
                      help="one UTF-8 text file, tokenized in memory with the gpt2 vocabulary; the last "
                           f"{VAL_FRACTION * 100:.0f}%% of its tokens are held out for the val loss")  # fmt: skip
    data.add_argument("--dataset_dir", "--dataset-dir", metavar="DIR", help="a dataset written by `lmshard prepare`")
    data.add_argument("dataset", nargs="?", metavar="DATASET_DIR", help="the same as --dataset_dir DIR")
    data.add_argument("--mixture", metavar="FILE", help="a TOML file of prepared datasets and their weights")
    data.add_argument("--data", metavar="CONFIG", help="a loader configuration file (TOML): data, sample shape, seed")
    ap.add_argument("--steps", type=int, default=300,
                    help="train up to this optimizer step: the run's total, so a --resume goes on from its "
                         "checkpoint's step to it (as nanoGPT's max_iters)")  # fmt: skip
    ap.add_argument("--batch-size", type=int, default=8, help="rows per rank per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--schedule", metavar="FILE",
                    help="a TOML file: schedule = [[step, global batch, seq_len], ...], instead of --batch-size and "
                         "--seq-len (docs/loader.md, Schedules)")  # fmt: skip
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-horizon", type=int, metavar="STEPS",
                    help="the step the cosine learning-rate decay (to lr/10) ends at (default: --steps, the "
                         "run's total, or the checkpoint's)")  # fmt: skip
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="under torchrun, 'cuda' means cuda:LOCAL_RANK")  # fmt: skip
    ap.add_argument("--resident", choices=("off", "auto", "on"), default="off",
                    help="upload the train data to the device and gather batches there (a dataset, --mixture or "
                         "--data; auto: when it fits half the free device memory)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--progress-every", type=float, default=60.0, metavar="SECONDS",
                    help="also print a short line when this many seconds pass without one (default 60; "
                         "0: after every step)")  # fmt: skip
    ap.add_argument("--save", help="write model + data state here at the end (rank 0)")
    ap.add_argument("--resume", help="continue from a checkpoint written by --save")
    ap.add_argument("--report", metavar="FILE",
                    help="each rank writes FILE with -rank<R> before the extension (report.json → "
                         "report-rank0.json, ...): JSON with the sha256 of the parameters before and after "
                         "training and the row offsets of every batch it drew")  # fmt: skip
    args = ap.parse_args(argv)
    sources = {"--input_file": args.input_file, "--dataset_dir": args.dataset_dir, "DATASET_DIR": args.dataset,
               "--mixture": args.mixture, "--data": args.data}  # fmt: skip
    given = [name for name, value in sources.items() if value is not None]
    if len(given) != 1:  # one line, not argparse's usage block
        got = f"got {' and '.join(given)}" if given else "got none"
        ap.exit(2, f"{ap.prog}: error: pass exactly one of --input_file FILE, --dataset_dir DIR, --mixture FILE or "
                   f"--data CONFIG ({got})\n")  # fmt: skip
    args.dataset_dir = args.dataset_dir or args.dataset
    return args


def text_splits(path: str) -> tuple[TokenDataset, TokenDataset | None]:
    """An --input_file tokenized in memory with gpt2: (its first 90% of tokens, the rest or None)."""
    from lmshard.tokenizers import load_tokenizer  # imports tiktoken: only this mode needs a tokenizer

    tok = load_tokenizer("gpt2")
    whole = TokenDataset.from_text(path, tok)
    n_val = int(whole.n_tokens * VAL_FRACTION)

    def part(start: int, length: int, split: str) -> TokenDataset:
        return TokenDataset.from_tokens(whole.tokens(start, length), eot_id=tok.eot_id, vocab_size=tok.n_vocab,
                                        name=f"{path} ({split})")  # fmt: skip

    train = part(0, whole.n_tokens - n_val, "train")
    return train, part(train.n_tokens, n_val, "val") if n_val else None


def open_data(
    args: argparse.Namespace, ranks: Ranks, device: torch.device
) -> tuple[Mixture | None, Mixture | TokenDataset, BatchStream, BatchStream | None]:
    """(mixture or None, train data, train batches, val batches or None). The train stream takes
    rank and world size from torchrun's environment, so each rank draws its own rows."""
    mix, held = None, None
    train: Mixture | TokenDataset
    if args.data:
        return config_data(args, ranks, device)
    if args.mixture:
        mix = train = Mixture.from_file(args.mixture, device=device, resident=resident_mode(args))
    elif args.input_file:
        train, held = text_splits(args.input_file)
    else:
        train = TokenDataset(args.dataset_dir, split="train", device=device, resident=resident_mode(args))
        if ranks.main and train.meta is not None and train.meta.n_tokens("val"):
            held = TokenDataset(args.dataset_dir, split="val")
    if args.schedule:
        plan = read_schedule(args.schedule)
        batches = train.random_batches(schedule=plan, seed=args.seed, device=device)
        args.batch_size, args.seq_len = batches.batch_size, plan.max_seq_len  # (the model's context, val rows)
    else:
        batches = train.random_batches(args.batch_size, args.seq_len, seed=args.seed, device=device)
    val = None
    if ranks.main and held is not None and held.n_tokens > args.seq_len + 1:
        # only rank 0 evaluates, so it reads every validation row itself
        val = held.random_batches(args.batch_size, args.seq_len, seed=0, rank=0, world_size=1, device=device)
    elif ranks.main and args.dataset_dir and not args.mixture:  # (said, not silently trained without a val loss)
        print(f"note: {args.dataset_dir} has no val split longer than a row ({held.n_tokens if held else 0:,} tokens, "
              f"rows of {args.seq_len}), so no val loss is logged; prepare it with a val split (a single text file: "
              "--text-mode paragraph, so its paragraphs are documents; else a larger --val-fraction)",
              flush=True)  # fmt: skip
    return mix, train, batches, val


def resident_mode(args: argparse.Namespace) -> bool | str:
    """--resident: the train split uploaded to the device, batches gathered there."""
    return {"off": False, "auto": "auto", "on": True}[args.resident]


def read_schedule(path: str) -> Schedule:
    """--schedule FILE: `schedule = [[step, global batch, seq_len], ...]` (or tables with tokens)."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise LmshardError(f"{path}: cannot read the schedule ({e}); write schedule = [[0, 8, 64], [200, 32, 64]]"
                           ) from None
    unknown = sorted(set(raw) - {"schedule"})
    if unknown or "schedule" not in raw:
        raise LmshardError(f"{path}: a schedule file holds schedule = [[step, global batch, seq_len], ...] only"
                           + (f" (not {unknown[0]!r})" if unknown else ""))  # fmt: skip
    try:
        return Schedule(raw["schedule"])
    except LmshardError as e:
        raise LmshardError(f"{path}: {e}") from None


def config_data(
    args: argparse.Namespace, ranks: Ranks, device: torch.device
) -> tuple[Mixture | None, Mixture | TokenDataset, BatchStream, BatchStream | None]:
    """open_data for --data CONFIG: the file's data and stream; its random or windows rows set the
    batch size and row length (and the val rows, from a dataset's val split, the same shape)."""
    from lmshard.loadconfig import open_config

    train, batches = open_config(args.data, device=device, resident=resident_mode(args))
    if not isinstance(batches, BatchStream) and getattr(batches, "shape", None) != "windows":
        raise LmshardError(f"{args.data}: this script trains on random or windows samples (x, y); packed and padded "
                           "rows need a model that takes position_ids and masked labels")  # fmt: skip
    args.batch_size, args.seq_len, args.seed = batches.batch_size, batches.seq_len, batches.seed
    if isinstance(batches, BatchStream):  # the model's context: the longest row of the file's schedule
        args.seq_len = batches.schedule.max_seq_len
    mix = train if isinstance(train, Mixture) else None
    val = None
    meta = getattr(train, "meta", None)  # (a [stream] has no val split on disk)
    if mix is None and ranks.main and meta is not None and meta.n_tokens("val") > args.seq_len + 1:
        held = TokenDataset(train.path, split="val")
        val = held.random_batches(args.batch_size, args.seq_len, seed=0, rank=0, world_size=1, device=device)
    return mix, train, batches, val


def save(path: str, model: nn.Module, opt: torch.optim.Optimizer, batches: BatchStream, horizon: int) -> None:
    """Model, optimizer, data position and LR horizon, written under a temporary name, then renamed."""
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "data": batches.state_dict(), "horizon": horizon}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    print(f"saved {path} (data state {batches.state_dict()})")


def train(args: argparse.Namespace, ranks: Ranks, device: torch.device) -> dict[str, Any]:
    """The training run; returns what --report writes."""
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    mix, data, batches, val = open_data(args, ranks, device)
    model = TinyGPT(data.vocab_size, args.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        batches.load_state_dict(ckpt["data"])
        if args.lr_horizon is None:
            args.lr_horizon = ckpt.get("horizon")
    if args.lr_horizon is None:
        args.lr_horizon = args.steps
    if batches.step >= args.steps and ranks.main:
        print(f"the checkpoint is at step {batches.step}, and --steps {args.steps} is the run's total: nothing to "
              f"train (pass a larger --steps to go on)", flush=True)  # fmt: skip
    if mix is not None and ranks.main:  # the whole run so far and to come; warns for a source past max_epochs
        end = max(batches.step, args.steps)
        rows = batches.schedule.first_row(end)  # (the run's rows up to `end`, whatever its schedule)
        for r in mix.report(1, max(rows, 1), batches.seq_len, seed=args.seed):
            print(f"  {r['source']}: weight {r['target']:.3f}, {r['epochs']:.2f} epochs by step {end}")
    if ranks.main:
        where = f"  ({ranks.world_size} processes, {dist.get_backend()})" if ranks.distributed else ""
        shape = (f"schedule {batches.schedule.record()}" if not batches.schedule.constant_shape
                 else f"{batches.tokens_per_step:,} tokens/step")  # fmt: skip
        print(f"{data}\n{batches}  ({shape}){where}", flush=True)
    report = {"rank": ranks.rank, "world_size": ranks.world_size, "initial_sha256": params_sha256(model)}
    drew = train_steps(args, ranks, model, opt, batches, mix, val)
    if args.save and ranks.main:
        save(args.save, model, opt, batches, args.lr_horizon)
    return {**report, "final_sha256": params_sha256(model), "batches": drew}


def train_steps(
    args: argparse.Namespace,
    ranks: Ranks,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: BatchStream,
    mix: Mixture | None,
    val: BatchStream | None,
) -> list[dict[str, Any]]:
    """Optimizer steps from the stream's step up to args.steps (the run's total); returns each
    batch's step and row offsets if --report is set."""
    # gradients are averaged over the ranks in backward(), so every rank takes the same optimizer step
    step_model = DistributedDataParallel(model) if ranks.distributed else model
    first = batches.step
    log = Log(ranks, first, batches.schedule.tokens_before, args.log_every, args.progress_every, mix, end=args.steps)
    if mix is not None and mix.curriculum is not None:
        curriculum, seq_len = mix.curriculum, batches.seq_len
        log.weights_now = lambda step: curriculum.weights(  # the weights of the step's first row
            np.array([batches.schedule.first_row(step)]), np.array([batches.schedule.first_row(step) + 1]),
            seq_len)[0].tolist()  # fmt: skip
    drew: list[dict[str, Any]] = []
    for step in range(first, args.steps):
        # a function of the step alone (so a resumed run gets the same rates): warmup, then a cosine
        # from lr to lr/10 at the horizon, and lr/10 after it (as nanoGPT's min_lr)
        decayed = min(step, args.lr_horizon) / max(args.lr_horizon, 1)
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * decayed)))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next(batches, None)
        if batch is None:  # a finite stream ([stream] epochs = N) ran out before --steps
            if ranks.main:
                print(f"the data ran out after {step - first} steps (its epochs are done); stopping")
            break
        if args.report:  # kept only when asked for: a list that grows with every step
            drew.append({"step": batch.step, "offsets": batch.offsets.tolist()})
        log.count(batch.offsets)
        loss = step_model(*batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.after(step, step == args.steps - 1, loss.detach(), model, val)
    return drew


def main() -> None:
    args = parse_args()
    ranks = Ranks()
    device = setup_device(ranks, args.device)
    try:
        report = train(args, ranks, device)
        if args.report:
            path = report_path(args.report, ranks.rank)
            path.write_text(json.dumps(report) + "\n")
            if ranks.main:
                print(f"report: {report_path(args.report, 0)}" + (", ..." if ranks.distributed else ""))
    except LmshardError as e:  # a file or dataset that cannot be used: its one line, which says the fix
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}")
    finally:
        if ranks.distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
