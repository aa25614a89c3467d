"""The MiniLM sentence embedder against transformers' BertModel on the same files."""

from __future__ import annotations

import pytest
import torch

from reference_server.engine.embedding import EMBEDDING_MAX_TOKENS, SentenceEmbedder, embedding_model_dir

pytestmark = pytest.mark.model
transformers = pytest.importorskip("transformers")

TEXTS = [
    "The capital of France is Paris.",
    "Paris is the capital of France.",
    "A completely unrelated sentence about trains, with numbers 12345 and ümlauts.",
    "",
]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


def reference_embeddings(texts: list[str]) -> torch.Tensor:
    folder = embedding_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def test_matches_transformers(embedder: SentenceEmbedder) -> None:
    vectors, counts = embedder.embed(TEXTS)
    got = torch.tensor(vectors)
    assert got.shape == (len(TEXTS), 384)
    torch.testing.assert_close(got, reference_embeddings(TEXTS), atol=1e-5, rtol=0)
    assert counts[3] == 2  # [CLS] [SEP]
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    assert float(got[0] @ got[1]) > 0.9 > 0.3 > float(got[0] @ got[2])


def test_batch_composition_does_not_matter(embedder: SentenceEmbedder) -> None:
    together, _ = embedder.embed(TEXTS)
    alone, _ = embedder.embed(TEXTS[:1])
    torch.testing.assert_close(torch.tensor(alone[0]), torch.tensor(together[0]), atol=1e-6, rtol=0)


def test_rejects_texts_beyond_the_window(embedder: SentenceEmbedder) -> None:
    embedder.embed(["word " * (EMBEDDING_MAX_TOKENS - 2)])  # exactly fits with [CLS] and [SEP]
    with pytest.raises(ValueError, match=r"texts\[1\] has 259 tokens"):
        embedder.embed(["fine", "word " * (EMBEDDING_MAX_TOKENS + 1)])
