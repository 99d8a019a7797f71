"""Train a tiny GPT on a prepared lmshard dataset, on the CPU or a GPU, to show the loader in a
real training loop. The loss should fall within a few hundred steps.

    python scripts/train_tiny_gpt.py data/demo --steps 300
    torchrun --nproc-per-node 2 scripts/train_tiny_gpt.py data/demo    # rank/world from the env
    python scripts/train_tiny_gpt.py --mixture mix.toml                 # several datasets, weighted

A mixture file names prepared datasets and their token weights (docs/loader.md, "Mixtures"):

    [[source]]
    path = "data/web"
    weight = 0.7
    [[source]]
    path = "data/code"
    weight = 0.3

The log then shows each source's target and observed share of the rows drawn so far.

Resuming: the data position is `batches.state_dict()`, a handful of integers saved in the
checkpoint beside the model (see --save / --resume).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmshard import Mixture, TokenDataset


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


@torch.no_grad()
def evaluate(model: nn.Module, val, steps: int = 4) -> float:  # type: ignore[no-untyped-def]
    model.eval()
    losses = [model(*next(val)).item() for _ in range(steps)]
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?", help="dataset directory written by `lmshard prepare`")
    ap.add_argument("--mixture", help="a TOML file of datasets and weights, instead of DATA")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save", help="write model + data state here at the end")
    ap.add_argument("--resume", help="continue from a checkpoint written by --save")
    args = ap.parse_args()

    if (args.data is None) == (args.mixture is None):
        ap.error("pass a dataset directory or --mixture FILE (one of them)")
    torch.manual_seed(args.seed)
    mix = Mixture.from_file(args.mixture) if args.mixture else None
    train = mix if mix is not None else TokenDataset(args.data, split="train")
    batches = train.random_batches(args.batch_size, args.seq_len, seed=args.seed, device=args.device)
    val = None
    if isinstance(train, TokenDataset) and train.meta is not None and train.meta.n_tokens("val") > args.seq_len + 1:
        val = TokenDataset(args.data, split="val").random_batches(
            args.batch_size, args.seq_len, seed=0, device=args.device
        )
    if mix is not None:
        drawn = np.zeros(len(mix.names), dtype=np.int64)
    model = TinyGPT(train.vocab_size, args.seq_len).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.resume:
        ckpt = torch.load(args.resume, map_location=args.device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        batches.load_state_dict(ckpt["data"])
    if mix is not None:  # the whole run so far and to come; warns for a source repeated past max_epochs
        end = batches.step + args.steps
        for r in mix.report(end, batches.global_batch_size, args.seq_len, seed=args.seed):
            print(f"  {r['source']}: weight {r['target']:.3f}, {r['epochs']:.2f} epochs by step {end}")
    print(f"{train}\n{batches}  ({batches.tokens_per_step:,} tokens/step)")
    start, t0 = batches.step, time.perf_counter()
    for step in range(start, start + args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.5 + 0.5 * math.cos(math.pi * (step - start) / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next(batches)
        x, y = batch
        if mix is not None:
            drawn += np.bincount(mix.locate(batch.offsets)[0], minlength=len(drawn))
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == start + args.steps - 1:
            extra = f"  val {evaluate(model, val):.3f}" if val is not None else ""
            rate = (step - start + 1) * batches.tokens_per_step / (time.perf_counter() - t0)
            if mix is not None:
                shares = drawn / drawn.sum()
                extra += "  " + " ".join(
                    f"{n}={o:.3f}/{w:.3f}" for n, o, w in zip(mix.names, shares, mix.weights, strict=True)
                )
            print(f"step {step:5d}  loss {loss.item():.3f}{extra}  {rate:,.0f} tok/s", flush=True)
    if args.save:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": batches.state_dict()}, args.save)
        print(f"saved {args.save} (data state {batches.state_dict()})")


if __name__ == "__main__":
    main()
