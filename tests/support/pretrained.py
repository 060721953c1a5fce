"""Pretrained models made here, nothing downloaded: a small random-weight model of a family with a BPE tokenizer
trained on the fine-tuning task's sample text (the task's `save_small_model`), then trained briefly on its words in
random order, so that a fine-tune starts from a model that knows the words but not the grammar; saved with save_pretrained into a folder that
stands in for a Unity Catalog volume's."""

from __future__ import annotations

import random

import torch

from distributed_training.tasks import fine_tune

PRETRAINING_STEPS, BLOCK, BATCH = 60, 32, 16


def sample_text(seed: int = 0, rows: int = 2000) -> list[str]:
    """The sample table's words (and the instruction's) in random order: "fox the sings the near."."""
    rng = random.Random(seed)
    words = ["the", "Reverse:", *(word for kind in fine_tune.WORDS.values() for word in kind)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "." for _ in range(rows)]


def pretrained_model(folder: str, family: str, seed: int = 0) -> str:
    """A small model of `family` in `folder`, pre-trained on sentences for PRETRAINING_STEPS steps: its folder."""
    texts = sample_text(seed + 1)
    model, tokenizer = fine_tune.save_small_model(folder, texts, family=family, seed=seed)
    ids = torch.tensor([token for text in texts[:1500] for token in tokenizer(text)["input_ids"] + [1]])
    blocks = ids[:len(ids) // (BLOCK + 1) * (BLOCK + 1)].view(-1, BLOCK + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(PRETRAINING_STEPS):
        batch = blocks[torch.randint(len(blocks), (BATCH,), generator=generator)]
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    return folder
