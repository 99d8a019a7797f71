"""Batches in Hugging Face transformers' convention (`batch.hf()`), checked against real
transformers models (tiny, random configurations: nothing is downloaded): given `batch.hf()`,
GPT-2's and Llama's own loss equals lmshard's next-token cross-entropy computed by hand from the
same logits, for window and packed batches; given lmshard's own keys (`model(**batch)`), it does
not: the model shifts the labels again (the silent mistake `hf()` exists for)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmshard.errors import ArgumentError
from lmshard.runtime import TokenDataset

transformers = pytest.importorskip("transformers")

VOCAB = 120


def _models() -> list[object]:
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=VOCAB - 1))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=VOCAB - 1, pad_token_id=0))
    return [gpt2.eval(), llama.eval()]  # fmt: skip


@pytest.fixture(scope="module")
def data():
    return TokenDataset.synthetic(n_tokens=20_000, vocab_size=VOCAB, seed=3, doc_len=23)


def _next_token_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """lmshard's loss by hand: position t predicts y[t]; -100 is no target; the last position
    has none in transformers' convention, so it is left out here too."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), y[:, :-1].reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("model", range(2), ids=["gpt2", "llama"])
def test_window_batches_in_the_hf_convention_give_next_token_loss(data, model):
    m = _models()[model]
    batch = next(iter(data.random_batches(4, 64, seed=1)))
    with torch.no_grad():
        logits = m(input_ids=batch.x).logits
        hf = m(**batch.hf()).loss
        shifted_twice = m(**dict(batch.items())).loss
    assert torch.isclose(hf, _next_token_ce(logits, batch.y), atol=1e-5)
    assert not torch.isclose(shifted_twice, _next_token_ce(logits, batch.y), atol=1e-3)  # lmshard's keys: wrong


@pytest.mark.parametrize("model", range(2), ids=["gpt2", "llama"])
def test_packed_batches_in_the_hf_convention_mask_each_documents_first_token(data, model):
    m = _models()[model]
    batch = next(iter(data.packed(64, strategy="bfd").batches(2)))
    fields = batch.hf(varlen=True)
    x, y = batch.x, batch.y
    assert (fields["labels"][:, 0] == -100).all()
    starts = (batch["position_ids"] == 0)
    assert (fields["labels"][:, 1:][starts[:, 1:]] == -100).all()  # no document predicts the next one's first token
    assert fields["cu_seq_lens_q"].dtype == torch.int32 and fields["max_length_k"] == batch["max_seqlen"]
    with torch.no_grad():
        logits = m(input_ids=x, position_ids=batch["position_ids"]).logits
        hf = m(input_ids=x, labels=fields["labels"], position_ids=batch["position_ids"]).loss
    assert torch.isclose(hf, _next_token_ce(logits, y), atol=1e-5)


@pytest.mark.parametrize("model", range(2), ids=["gpt2", "llama"])
def test_a_packed_rows_documents_stay_apart_with_the_mask(data, model):
    """hf(mask=True): with the 4D document mask, changing a token of one document of a packed row
    changes no other document's logits (without it, sdpa attends across them); the loss is still
    the next-token CE by hand, from the same logits."""
    m = _models()[model]
    batch = next(iter(data.packed(64, strategy="bfd").batches(2)))
    fields = batch.hf(mask=True)
    pos = batch["position_ids"]
    doc = torch.cumsum((pos == 0).to(torch.int64), dim=1)
    row, first = 0, int(doc[0].min())
    assert int(doc[0].max()) > first  # several documents in the row
    changed = batch.x.clone()
    changed[row, 1] = (changed[row, 1] + 1) % VOCAB  # a token of the row's first document
    with torch.no_grad():
        a = m(input_ids=batch.x, position_ids=pos, attention_mask=fields["attention_mask"]).logits
        b = m(input_ids=changed, position_ids=pos, attention_mask=fields["attention_mask"]).logits
        plain = m(input_ids=changed, position_ids=pos).logits
        loss = m(**fields).loss
    others = doc[row] != first
    assert torch.allclose(a[row][others], b[row][others], atol=1e-6)  # the other documents see nothing of it
    assert not torch.allclose(a[row][others], plain[row][others], atol=1e-6)  # (without the mask they would)
    assert torch.isclose(loss, _next_token_ce(a, batch.y), atol=1e-5)


def test_hf_refuses_what_its_convention_cannot_say(data):
    batch = next(iter(data.random_batches(2, 32, seed=0, shift=2)))
    with pytest.raises(ArgumentError, match="predict the next token only; this batch has shift=2"):
        batch.hf()
    plain = next(iter(data.random_batches(2, 32, seed=0)))
    for options in ({"varlen": True}, {"mask": True}):
        with pytest.raises(ArgumentError, match="no document boundaries"):
            plain.hf(**options)


def test_transformers_trainer_trains_on_windows_with_the_collator(data, tmp_path):
    """transformers' Trainer over `ds.windows(T)` with `data_collator=lmshard.hf_collator`: 20
    steps of a tiny GPT-2 on CPU, and the collated batch's loss is lmshard's next-token loss."""
    import lmshard

    model = _models()[0]
    windows = data.windows(32)
    collated = lmshard.hf_collator([windows[i] for i in range(4)])
    x = torch.stack([torch.as_tensor(windows[i][0]) for i in range(4)])
    y = torch.stack([torch.as_tensor(windows[i][1]) for i in range(4)])
    with torch.no_grad():
        assert torch.isclose(model(**collated).loss, _next_token_ce(model(input_ids=x).logits, y), atol=1e-5)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=20, per_device_train_batch_size=4,
                                          report_to=[], use_cpu=True, save_strategy="no", logging_steps=10,
                                          disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
    trainer = transformers.Trainer(model=model.train(), args=args, train_dataset=windows,
                                   data_collator=lmshard.hf_collator)  # fmt: skip
    result = trainer.train()
    assert trainer.state.global_step == 20 and torch.isfinite(torch.tensor(result.training_loss))


def test_the_mask_of_window_batches_follows_their_document_boundaries(data):
    """Windows with cu_seqlens: the mask lets a token see the earlier tokens of its own document
    only, documents numbered here from the tokens themselves (a new one after each EOT id)."""
    import numpy as np

    batch = next(iter(data.random_batches(3, 48, seed=2, cu_seqlens=True)))
    allowed = batch.hf(mask=True)["attention_mask"][:, 0].numpy()
    x = batch.x.numpy()
    after_eot = np.concatenate([np.zeros((3, 1), bool), x[:, :-1] == data.eot_id], axis=1)
    doc = np.cumsum(after_eot, axis=1)
    want = (doc[:, :, None] == doc[:, None, :]) & np.tril(np.ones((48, 48), bool))
    assert (allowed == want).all() and after_eot.sum() > 2


def test_the_collator_refuses_windows_whose_targets_are_not_the_next_tokens(data):
    """ds.windows(T, shift=2) items through hf_collator: refused in one line (the model would
    train on the next token, not what the windows hold); shift=1 windows pass."""
    from lmshard import hf_collator

    shifted = data.windows(16, shift=2)
    with pytest.raises(ArgumentError, match="not their next tokens .*make the windows with shift=1"):
        hf_collator([shifted[0], shifted[1]])
    plain = data.windows(16)
    assert torch.equal(hf_collator([plain[0], plain[1]])["input_ids"][0], torch.as_tensor(plain[0][0]).long())


@pytest.mark.parametrize("model", range(2), ids=["gpt2", "llama"])
def test_padded_batches_in_the_hf_convention_keep_their_padding_mask(data, model):
    """A padded batch's hf(): its 2D attention_mask passed on (padding seen by no token), labels
    -100 at padding; hf(mask=True) the 4D mask of one document a row, giving the same logits on
    the tokens; the loss is the next-token CE by hand over the tokens."""
    m = _models()[model]
    batch = next(iter(data.padded_batches(3, 40, seed=2, pad_to_max=True)))
    pad = batch["attention_mask"]
    assert (pad == 0).any()  # some rows are padded
    fields, four_d = batch.hf(), batch.hf(mask=True)
    assert torch.equal(fields["attention_mask"], pad) and four_d["attention_mask"].dim() == 4
    assert (fields["labels"][pad == 0] == -100).all()
    with torch.no_grad():
        a = m(**fields)
        b = m(**four_d)
    real = pad.bool()
    assert torch.allclose(a.logits[real], b.logits[real], atol=1e-5)
    assert torch.isclose(a.loss, _next_token_ce(a.logits, batch.y), atol=1e-5)
    assert torch.isclose(b.loss, a.loss, atol=1e-5)
