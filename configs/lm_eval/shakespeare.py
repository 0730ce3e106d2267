"""The data of `shakespeare_lastword.yaml`: passages of the plays the quick start uses (the
`shakespeare` package's texts), each cut before its last word. Built here from installed files,
so the task needs no network."""

from __future__ import annotations

import re

PASSAGES_PER_TEXT = 5
CONTEXT_LINES = 4
WORD = re.compile(r"\s([A-Za-z]{4,})[^A-Za-z'-]*$")  # a whole word of 4+ letters ends the line
SKIP = 0.1  # of each text's lines: the title page and the list of persons


def passages(text: str, count: int = PASSAGES_PER_TEXT) -> list[dict]:
    """`count` passages spread over `text` past its opening: CONTEXT_LINES lines, the last of
    six words or more ending in a whole word, split into the context and that word."""
    lines = [line.strip() for line in text.splitlines()]
    start = max(CONTEXT_LINES, int(len(lines) * SKIP))
    ends = [i for i in range(start, len(lines))
            if len(lines[i].split()) >= 6 and WORD.search(lines[i])]  # fmt: skip
    picked = ends[:: max(1, len(ends) // count)][:count]
    docs = []
    for end in picked:
        context = "\n".join(lines[end - CONTEXT_LINES + 1 : end + 1])
        match = WORD.search(context)
        docs.append({"context": context[: match.start(1)].rstrip(), "word": match.group(1)})
    return docs


def last_words(**_):
    """A `datasets.DatasetDict` with a `test` split of the passages of every text."""
    import datasets

    from megatron.data.embedded import shakespeare_texts

    docs = [d for path in shakespeare_texts() for d in passages(path.read_text(errors="ignore"))]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})
