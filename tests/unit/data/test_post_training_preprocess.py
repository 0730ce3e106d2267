"""Post-training preprocessing: chat/SFT, preference pairs and KTO into aligned datasets.

Masks are checked by decoding the tokens that carry loss against text written here, and the
chat masks against GPT-NeoX's `build_chat` procedure re-written here (tokenize each rendered
prefix, label the new tokens of assistant turns). Every output is read back with our
MMapIndexedDataset.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.preprocess import PreprocessError
from megatron.data.preprocess.post_training import PostTrainingOptions, preprocess_post_training
from megatron.data.tokenizers import make_tokenizer
from tests.unit.data.conftest import HF_TOKENIZER, SPM_MODEL

IGNORE = -100

# transformers' former class-wide default template (ChatML), as published; jinja2 renders it.
CHATML_JINJA = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who wrote Hamlet?"},
    {"role": "assistant", "content": "Shakespeare."},
    {"role": "user", "content": "When?"},
    {"role": "assistant", "content": "Around 1600."},
]


def _gpt2(gpt2_files):
    return dict(tokenizer_type="GPT2BPETokenizer", vocab_file=gpt2_files[0],
                merge_file=gpt2_files[1])  # fmt: skip


def _jsonl(path, records):
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
    return path


def _run(tmp_path, fmt, records, tok, **kw):
    src = _jsonl(tmp_path / "in.jsonl", records)
    opts = PostTrainingOptions(inputs=[str(src)], output_prefix=str(tmp_path / "out"),
                               data_format=fmt, **tok, **kw)  # fmt: skip
    log = io.StringIO()
    summary = preprocess_post_training(opts, log=log)
    return summary, log.getvalue()


def _read(tmp_path, name):
    return MMapIndexedDataset(tmp_path / f"out_{name}_document")


def _loss_runs(tokenizer, tokens, labels):
    """Decoded text of each contiguous run of tokens that carry loss."""
    runs, current = [], []
    for tok, lab in zip(tokens, labels):
        if lab != IGNORE:
            assert lab == tok, "a label that carries loss is the token itself"
            current.append(int(tok))
        elif current:
            runs.append(tokenizer.detokenize(current))
            current = []
    if current:
        runs.append(tokenizer.detokenize(current))
    return runs


def _neox_build_chat(tokenizer, render, chat):
    """GPT-NeoX's build_chat (apply_mask, all turns): tokenize each rendered prefix, keep the new
    tokens, label them when the turn is the assistant's; then EOS, labelled after a labelled
    token."""
    tokens, mask = [], []
    for i, turn in enumerate(chat):
        add_gen = i + 1 < len(chat) and chat[i + 1]["role"] == "assistant"
        new = tokenizer.tokenize(render(chat[: i + 1], add_gen))[len(tokens) :]
        tokens += new
        mask += new if turn["role"] == "assistant" else [IGNORE] * len(new)
    mask.append(tokenizer.eod if mask[-1] != IGNORE else IGNORE)
    tokens.append(tokenizer.eod)
    return tokens, mask


def test_chat_labels_only_assistant_turns(tmp_path, gpt2_files):
    import jinja2

    tok = make_tokenizer(**_gpt2(gpt2_files))
    summary, _ = _run(tmp_path, "chat", [{"messages": CHAT}], _gpt2(gpt2_files))
    text, label = _read(tmp_path, "text"), _read(tmp_path, "text_label")
    assert len(text) == len(label) == 1 and list(text.sizes) == list(label.sizes)
    assert label.dtype == np.int32
    tokens, labels = text.get(0), label.get(0)
    assert _loss_runs(tok, tokens, labels) == [
        "Shakespeare.<|im_end|>\n",
        "Around 1600.<|im_end|>\n<|endoftext|>",
    ]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(CHATML_JINJA)

    def render(messages, add_generation_prompt):
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)

    assert tok.detokenize(tokens) == render(CHAT, False) + "<|endoftext|>"
    neox_tokens, neox_labels = _neox_build_chat(tok, render, CHAT)
    assert tokens.tolist() == neox_tokens and labels.tolist() == neox_labels
    assert summary.documents == {"text": 1, "text_label": 1}


def test_tokenizer_chat_template_and_bos_once(tmp_path):
    """An HF tokenizer whose post-processor adds BOS, with a jinja template (from its
    tokenizer_config.json) that writes {{ bos_token }}: one BOS at the start, none per turn."""
    from tokenizers import Tokenizer, processors

    backend = Tokenizer.from_file(str(HF_TOKENIZER))
    backend.add_special_tokens(["<s>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", bos)])  # fmt: skip
    folder = tmp_path / "tok"
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")  # fmt: skip
    config = {"chat_template": template, "bos_token": {"content": "<s>"}, "eos_token": "x"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok_args = dict(tokenizer_type="HFTokenizer", vocab_file=str(folder / "tokenizer.json"))
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]
    _run(tmp_path, "chat", [{"messages": chat}], tok_args)
    tok = make_tokenizer(**tok_args)
    tokens, labels = _read(tmp_path, "text").get(0), _read(tmp_path, "text_label").get(0)
    assert tokens[0] == bos and list(tokens).count(bos) == 1
    assert tok.detokenize(tokens) == "<s>[user] Hi there\n[assistant] Hello\n<|endoftext|>"
    assert _loss_runs(tok, tokens, labels) == ["Hello\n<|endoftext|>"]
    # plain strings get the tokenizer's own BOS, as preprocess_data.py's documents do
    _run(tmp_path, "pairs", [{"prompt": "Hi", "chosen": " there", "rejected": " you"}], tok_args)
    tokens, labels = _read(tmp_path, "text_pos").get(0), _read(tmp_path, "text_pos_label").get(0)
    assert tokens.tolist() == tok.tokenize("Hi there") + [tok.eod]
    assert tokens[0] == bos and labels[0] == IGNORE
    assert _loss_runs(tok, tokens, labels) == [" there<|endoftext|>"]


def test_chatml_default_matches_the_published_jinja(tmp_path):
    from megatron.data.preprocess.chat_template import ChatMLTemplate, load_chat_template

    (tmp_path / "t.jinja").write_text(CHATML_JINJA)
    jinja = load_chat_template(str(tmp_path / "t.jinja"), None)
    for add in (False, True):
        assert ChatMLTemplate().render(CHAT[:2], add) == jinja.render(CHAT[:2], add)
    assert isinstance(load_chat_template(None, str(HF_TOKENIZER)), ChatMLTemplate)
    with pytest.raises(PreprocessError, match="--chat-template nope.jinja"):
        load_chat_template("nope.jinja", None)


def test_pairs_align_and_mask_the_prompt(tmp_path, gpt2_files):
    tok = make_tokenizer(**_gpt2(gpt2_files))
    records = [
        {"prompt": "Q: 2+2?\nA:", "chosen": " 4", "rejected": " 5, surely"},
        {"prompt": [{"role": "user", "content": "Hi"}],
         "chosen": [{"role": "assistant", "content": "Hello!"}],
         "rejected": [{"role": "assistant", "content": "Go away."}]},
        {"prompt": "Name a colour",  # ultrafeedback_binarized: complete conversations
         "chosen": [{"role": "user", "content": "Name a colour"},
                    {"role": "assistant", "content": "Blue"}],
         "rejected": [{"role": "user", "content": "Name a colour"},
                      {"role": "assistant", "content": "Seven"}]},
    ]  # fmt: skip
    _run(tmp_path, "pairs", records, _gpt2(gpt2_files))
    pos, neg = _read(tmp_path, "text_pos"), _read(tmp_path, "text_neg")
    pos_l, neg_l = _read(tmp_path, "text_pos_label"), _read(tmp_path, "text_neg_label")
    assert len(pos) == len(neg) == len(pos_l) == len(neg_l) == 3
    assert list(pos.sizes) == list(pos_l.sizes) and list(neg.sizes) == list(neg_l.sizes)
    expected = [
        ("Q: 2+2?\nA:", " 4<|endoftext|>", " 5, surely<|endoftext|>"),
        ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
         "Hello!<|im_end|>\n<|endoftext|>", "Go away.<|im_end|>\n<|endoftext|>"),
        ("<|im_start|>user\nName a colour<|im_end|>\n<|im_start|>assistant\n",
         "Blue<|im_end|>\n<|endoftext|>", "Seven<|im_end|>\n<|endoftext|>"),
    ]  # fmt: skip
    for i, (prompt, chosen, rejected) in enumerate(expected):
        for data, labels, completion in ((pos, pos_l, chosen), (neg, neg_l, rejected)):
            tokens, lab = data.get(i), labels.get(i)
            assert tok.detokenize(tokens) == prompt + completion
            assert _loss_runs(tok, tokens, lab) == [completion]
            n_prompt = int((lab == IGNORE).sum())
            assert tok.detokenize(tokens[:n_prompt]) == prompt  # the prompt is all masked


def test_a_document_is_its_whole_text_tokenized(tmp_path, gpt2_files):
    """SentencePiece puts its leading space once (not before every piece), and a token spanning
    the prompt/completion boundary belongs to the completion."""
    import sentencepiece as spm

    records = [{"prompt": "Hi", "chosen": " there", "rejected": " friend"}]
    _run(tmp_path, "pairs", records, dict(tokenizer_type="SPMTokenizer", vocab_file=str(SPM_MODEL)))
    sp = spm.SentencePieceProcessor(model_file=str(SPM_MODEL))
    eod = make_tokenizer("SPMTokenizer", str(SPM_MODEL)).eod
    assert _read(tmp_path, "text_pos").get(0).tolist() == sp.encode("Hi there") + [eod]
    assert _read(tmp_path, "text_neg").get(0).tolist() == sp.encode("Hi friend") + [eod]

    tok = make_tokenizer(**_gpt2(gpt2_files))
    _run(tmp_path, "pairs", [{"prompt": "Hel", "chosen": "lo world", "rejected": "p me"}],
         _gpt2(gpt2_files))  # fmt: skip
    pos, pos_label = _read(tmp_path, "text_pos").get(0), _read(tmp_path, "text_pos_label").get(0)
    assert pos.tolist() == tok.tokenize("Hello world") + [tok.eod]
    assert _loss_runs(tok, pos, pos_label) == ["Hello world<|endoftext|>"]


def test_kto_text_label_and_reward(tmp_path, gpt2_files):
    tok = make_tokenizer(**_gpt2(gpt2_files))
    records = [
        {"prompt": "The sky is", "completion": " blue.", "label": True},
        {"prompt": [{"role": "user", "content": "2+2?"}],
         "completion": [{"role": "assistant", "content": "5"}], "label": False},
    ]  # fmt: skip
    _run(tmp_path, "kto", records, _gpt2(gpt2_files))
    text, label, reward = (_read(tmp_path, n) for n in ("text", "text_label", "text_reward"))
    assert list(text.sizes) == list(label.sizes) == list(reward.sizes) and len(reward) == 2
    assert reward.dtype == np.float32
    assert (reward.get(0) == 1.0).all() and (reward.get(1) == -1.0).all()
    assert _loss_runs(tok, text.get(0), label.get(0)) == [" blue.<|endoftext|>"]
    assert _loss_runs(tok, text.get(1), label.get(1)) == ["5<|im_end|>\n<|endoftext|>"]


def test_label_scope_eod_labels_only_the_last_token(tmp_path, gpt2_files):
    record = {"prompt": "Q:", "chosen": " yes", "rejected": " no"}
    _run(tmp_path, "pairs", [record], _gpt2(gpt2_files), label_scope="eod")
    for name in ("text_pos", "text_neg"):
        tokens, labels = _read(tmp_path, name).get(0), _read(tmp_path, f"{name}_label").get(0)
        assert (labels[:-1] == IGNORE).all() and labels[-1] == tokens[-1] == 50256


USER, BOT = {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}
BAD_PAIRS = [  # (record, the kind of problem it is counted under)
    ('{"prompt": "p", "chosen": "c"\n', "malformed JSON line"),
    (b'{"prompt": "\xff", "chosen": "a", "rejected": "b"}\n', "non-UTF-8 bytes"),
    ({"prompt": "p", "rejected": "r"}, "missing key 'chosen'"),
    ({"chosen": "c", "rejected": "r"}, "missing key 'prompt'"),
    ({"prompt": "p", "chosen": 3, "rejected": "r"}, "key 'chosen' is not a string or a message"),
    ({"prompt": 1, "chosen": "c", "rejected": "r"}, "key 'prompt' is not a string"),
    ({"prompt": "p", "chosen": "c", "rejected": [BOT]}, "not both strings or both message lists"),
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "identical"),
    ({"chosen": [USER, BOT], "rejected": [BOT, USER]}, "share no prompt"),
    ({"prompt": "p", "chosen": [{"role": "assistant"}], "rejected": [BOT]}, "not a list of"),
    ({"prompt": "p", "chosen": "", "rejected": "r"}, "no token carries loss"),
    ({"prompt": "p", "chosen": " long" * 40, "rejected": "r"}, "longer than --seq-length"),
]


def test_every_bad_pair_is_counted_and_dropped_from_both_sides(tmp_path, gpt2_files):
    good = [{"prompt": "P", "chosen": f" good {i}", "rejected": f" bad {i}"} for i in range(3)]
    lines = [good[0]] + [r for r, _ in BAD_PAIRS[:6]] + [good[1]] + [r for r, _ in BAD_PAIRS[6:]]
    lines.append(good[2])
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(r if isinstance(r, bytes) else
                              (r if isinstance(r, str) else json.dumps(r) + "\n").encode()
                              for r in lines))  # fmt: skip
    opts = PostTrainingOptions([str(path)], str(tmp_path / "out"), "pairs", seq_length=16,
                               **_gpt2(gpt2_files))  # fmt: skip
    log = io.StringIO()
    summary = preprocess_post_training(opts, log=log)
    assert sum(summary.problems.values()) == len(BAD_PAIRS)
    for (_, kind), line in zip(BAD_PAIRS, [2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14]):
        [(reported, where)] = [(k, w) for k, w in summary.problem_examples.items() if kind in k]
        assert where == [f"{path}:{line}"], reported
    assert f"skipped {len(BAD_PAIRS)} bad records" in log.getvalue()
    tok = make_tokenizer(**_gpt2(gpt2_files))
    pos, neg = _read(tmp_path, "text_pos"), _read(tmp_path, "text_neg")
    assert len(pos) == len(neg) == 3
    for i in range(3):  # document i of both sides is good pair i
        assert tok.detokenize(pos.get(i)) == f"P good {i}<|endoftext|>"
        assert tok.detokenize(neg.get(i)) == f"P bad {i}<|endoftext|>"


def test_bad_chat_and_kto_records(tmp_path, gpt2_files):
    (tmp_path / "alt.jinja").write_text(  # refuses non-alternating roles, as many templates do
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}|{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )  # fmt: skip
    (tmp_path / "last.jinja").write_text(  # renders the last message differently
        "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}{% endfor %}"
    )
    cases = [
        ("chat", {"messages": [USER]}, "no token carries loss", None),
        ("chat", {"messages": []}, "not a list of", None),
        ("chat", {"messages": "hi"}, "not a list of", None),
        ("chat", {"messages": [BOT, BOT]}, "refused the messages", "alt.jinja"),
        ("chat", {"messages": [USER, BOT]}, "not turn by turn", "last.jinja"),
        ("kto", {"prompt": "p", "completion": "c", "label": 1}, "'label' is not true or", None),
        ("kto", {"prompt": "p", "completion": "c"}, "missing key 'label'", None),
        ("kto", {"prompt": "p", "completion": [BOT], "label": True}, "same form", None),
    ]
    for i, (fmt, record, kind, template) in enumerate(cases):
        good = {"messages": [BOT] if template == "last.jinja" else [USER, BOT]}
        if fmt == "kto":
            good = {"prompt": "p", "completion": "c", "label": True}
        out = tmp_path / str(i)
        out.mkdir()
        chat_template = str(tmp_path / template) if template else None
        summary, _ = _run(out, fmt, [record, good], _gpt2(gpt2_files), chat_template=chat_template)
        assert [k for k in summary.problems] == [next(k for k in summary.problems if kind in k)]
        assert set(summary.documents.values()) == {1}, (fmt, record)


def test_strict_and_no_usable_record_leave_no_output(tmp_path, gpt2_files):
    records = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p"}]
    with pytest.raises(PreprocessError, match=r"in.jsonl:2: missing key 'chosen' \(--strict\)"):
        _run(tmp_path, "pairs", records, _gpt2(gpt2_files), strict=True)
    with pytest.raises(PreprocessError, match="no usable pairs record"):
        _run(tmp_path, "pairs", records[1:], _gpt2(gpt2_files))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_two_workers_write_the_same_files(tmp_path, gpt2_files):
    records = [{"prompt": f"p{i}", "completion": f" c{i}", "label": i % 2 == 0} for i in range(50)]
    src = _jsonl(tmp_path / "in.jsonl", records)
    outputs = []
    for workers in (1, 2):
        prefix = str(tmp_path / f"w{workers}")
        opts = PostTrainingOptions([str(src)], prefix, "kto", workers=workers, chunk_bytes=256,
                                   **_gpt2(gpt2_files))  # fmt: skip
        preprocess_post_training(opts, log=io.StringIO())
        outputs.append({p.name[2:]: p.read_bytes() for p in tmp_path.glob(f"w{workers}_*")})
    assert len(outputs[0]) == 6 and outputs[0] == outputs[1]


def test_companions_are_whole_before_the_first_output(tmp_path, gpt2_files, monkeypatch):
    """A run dying while finishing: an older complete set no longer looks whole (its first
    output's .idx is gone), and the new first output only appears after every companion."""
    from megatron.data.indexed_writer import IndexedDatasetWriter

    records = [{"prompt": "p", "chosen": " a", "rejected": " b"}]
    _run(tmp_path, "pairs", records, _gpt2(gpt2_files))  # the older, complete set
    finalize = IndexedDatasetWriter.finalize

    def dies_on_the_first_output(self):
        if str(self.prefix).endswith("_text_pos_document"):
            raise KeyboardInterrupt
        finalize(self)

    monkeypatch.setattr(IndexedDatasetWriter, "finalize", dies_on_the_first_output)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "pairs", records, _gpt2(gpt2_files))
    names = {p.name for p in tmp_path.iterdir()}
    assert "out_text_pos_document.idx" not in names
    assert {"out_text_neg_document.idx", "out_text_neg_label_document.idx"} <= names


def test_cli_writes_the_datasets_and_prints_the_config_keys(tmp_path, gpt2_files):
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[3] / "tools" / "preprocess_post_training.py"
    src = _jsonl(tmp_path / "kto.jsonl", [{"prompt": "a", "completion": " b", "label": False}])
    cmd = [
        sys.executable,
        str(tool),
        "--format",
        "kto",
        "--input",
        str(src),
        "--output-prefix",
        str(tmp_path / "kto"),
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        gpt2_files[0],
        "--merge-file",
        gpt2_files[1],
        "--seq-length",
        "8",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f'train_reward_data_paths: ["{tmp_path}/kto_text_reward_document"]' in done.stderr
    for name in ("text", "text_label", "text_reward"):
        assert len(MMapIndexedDataset(tmp_path / f"kto_{name}_document")) == 1
    bad = subprocess.run(cmd + ["--seq-length", "0"], capture_output=True, text=True)
    assert bad.returncode == 1 and "error: --seq-length must be >= 1, got 0" in bad.stderr


def test_preference_set_from_the_embedded_corpus(tmp_path, gpt2_files):
    from megatron.data.preprocess.preference_corpus import build_preference_set
    from tests.unit.data.conftest import SAMPLE_TEXT

    shutil.copy(SAMPLE_TEXT, tmp_path / "sample.txt")
    prefixes = build_preference_set(tmp_path, n_train=20, n_valid=4, seed=7, seq_length=128,
                                    texts=[tmp_path / "sample.txt"], log=io.StringIO())  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "preference" / "train.jsonl").open()]
    source = " ".join(SAMPLE_TEXT.read_text(encoding="utf-8").split())
    assert len(rows) == 20
    for row in rows:  # chosen: the real continuation; rejected: the same words, reordered
        assert row["prompt"] + row["chosen"] in source
        assert row["chosen"] != row["rejected"]
        assert sorted(row["chosen"].split()) == sorted(row["rejected"].split())
    pos = MMapIndexedDataset(f"{prefixes['pairs_train']}_text_pos_document")
    neg = MMapIndexedDataset(f"{prefixes['pairs_train']}_text_neg_document")
    chat = MMapIndexedDataset(f"{prefixes['chat_valid']}_text_label_document")
    assert len(pos) == len(neg) == 20 and len(chat) == 4
