"""The generated models' tokenizer: a byte-level BPE with Qwen's pipeline, specials and chat template.

Hand-written tokenizer.json (fixed key order, hand-listed merges) so the bytes are the same on every
machine; the vocabulary is padded with reserved special tokens up to the model's vocab_size, so that the
tokenizer's size always equals the config's (512 for the small shapes, 151936 for Qwen3-235B's).
"""

from __future__ import annotations

import itertools

VOCAB_SIZE = 512  # bytes + merges + specials, padded with reserved tokens; a multiple of 64
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's pre-tokenizer regex. Using Qwen's exact pipeline means transformers v5's Qwen2Tokenizer,
# which rebuilds the pipeline in code, would tokenize identically to tokenizer.json.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Each entry becomes a chain of merges ending in a single token, in this order (earlier = lower
# rank). Hand-listed instead of trained: BPE training breaks frequency ties nondeterministically.
MERGE_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " was",
    " on", " be", " by", " are", " this", " you", " not", " or", " have", " from", " at", " an",
    " which", " one", " but", " all", " can", " will", " we", " they", " he", " she", " his",
    " her", " their", " there", " what", " if", " would", " about", " more", " some", " when",
    " out", " so", " up", " do", " no", " my", " your", " me", " how", " time", " just", " know",
    " people", " into", " year", " good", " model", " token", " hello", " world", " answer",
    " question", " user", " assistant", " system", "user", "assistant", "system", "ing", "ed",
    "er", "ly", "tion", "es", "The", "Hello", "\n\n", "  ", "    ", ".\n",
)

def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable char map used by the ByteLevel pre-tokenizer."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    unprintable = [b for b in range(256) if b not in printable]
    return {b: chr(b) if b in printable else chr(256 + unprintable.index(b)) for b in range(256)}


def _apply_merges(pieces: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Plain BPE: repeatedly merge the adjacent pair of lowest rank."""
    while len(pieces) > 1:
        pairs = [(ranks.get(p, len(ranks)), i) for i, p in enumerate(itertools.pairwise(pieces))]
        rank, i = min(pairs)
        if rank == len(ranks):
            return pieces
        pieces = [*pieces[:i], pieces[i] + pieces[i + 1], *pieces[i + 2:]]
    return pieces


def build_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    """Return (BPE tokens by id, merges); ids 0..255 are the bytes themselves."""
    to_char = byte_to_unicode()
    ranks: dict[tuple[str, str], int] = {}  # insertion order == rank order
    for word in MERGE_WORDS:
        pieces = _apply_merges([to_char[b] for b in word.encode()], ranks)
        while len(pieces) > 1:
            ranks.setdefault((pieces[0], pieces[1]), len(ranks))
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
    # A merge result is at least two chars, so it never collides with a byte token.
    tokens = [*(to_char[b] for b in range(256)), *dict.fromkeys(a + b for a, b in ranks)]
    assert len(tokens) + len(SPECIAL_TOKENS) <= VOCAB_SIZE, "MERGE_WORDS overflow the vocab"
    return tokens, list(ranks)


def tokenizer_json(vocab_size: int = VOCAB_SIZE) -> dict:
    """tokenizer.json as the tokenizers library serialises it, minus version-specific fields."""
    tokens, merges = build_vocab()
    # Qwen specials directly after the BPE vocab, then reserved pads up to vocab_size.
    num_reserved = vocab_size - len(tokens) - len(SPECIAL_TOKENS)
    specials = [*SPECIAL_TOKENS, *(f"<|reserved_special_token_{i}|>" for i in range(num_reserved))]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    added = [{"id": len(tokens) + i, "content": tok, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, tok in enumerate(specials)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOKENIZE_REGEX}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        # Merges as "a b" strings: the one format every tokenizers release reads (no token holds a
        # space, ByteLevel maps it to "Ġ").
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": [f"{a} {b}" for a, b in merges]},
    }
