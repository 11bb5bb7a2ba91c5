"""Read back the data an attention view page embeds (model/inspection/attention_view.py)."""
from __future__ import annotations

import json
import re

import numpy as np


def embedded_data(page: str) -> dict:
    """The JSON in the page's `<script id="mingyue-data">`. raises ValueError if there is none."""
    found = re.search(r'<script id="mingyue-data" type="application/json">(.*?)</script>', page, re.S)
    if not found:
        raise ValueError("no embedded view data")
    return json.loads(found.group(1))


def dense(rows: list, scale: int) -> np.ndarray:
    """[layer][head][row i (i + 1 integers)] → (L, H, T, T) float weights, zero above the diagonal."""
    L, H, T = len(rows), len(rows[0]), len(rows[0][0])
    out = np.zeros((L, H, T, T))
    for layer in range(L):
        for head in range(H):
            for i, r in enumerate(rows[layer][head]):
                out[layer, head, i, : len(r)] = np.asarray(r) / scale
    return out
