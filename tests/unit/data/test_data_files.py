"""Real data: text / jsonl / token files, `geotrain data prepare`, keyed batches, validation loss, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cli.main import main
from geotrain.data import (
    ByteTokenizer,
    DataError,
    load_corpus,
    load_text_tokenizer,
    prepare_token_file,
    read_documents,
    read_token_file,
    replica_batch,
    sidecar_path,
    window_starts,
    write_token_file,
)
from geotrain.models import ModelOptions, even_boundaries, lm_loss, load_model_spec, validation_loss

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def test_a_text_file_is_one_document_of_utf8_bytes_split_at_the_end(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(TEXT + "héllo")
    corpus = load_corpus(path, val_fraction=0.25)
    raw = (TEXT + "héllo").encode()
    assert corpus.vocab_size == 256 and corpus.tokenizer == "bytes"
    assert len(corpus.train) + len(corpus.val) == len(raw)
    assert len(corpus.val) == round(0.25 * len(raw))
    assert bytes(np.concatenate([corpus.train, corpus.val]).astype(np.uint8)) == raw


def test_jsonl_documents_are_joined_by_the_separator_and_a_directory_is_read_in_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n')
    (tmp_path / "a.txt").write_text("zero")
    (tmp_path / "ignored.csv").write_text("x,y")
    docs = list(read_documents(tmp_path))
    assert [d.text for d in docs] == ["zero", "one", "two"]
    assert docs[2].origin.endswith("b.jsonl:3")
    corpus = load_corpus(tmp_path, val_fraction=0.0)
    assert ByteTokenizer().decode(corpus.train) == "zero\none\ntwo" and len(corpus.val) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=40), min_size=1, max_size=6))
def test_jsonl_round_trips_any_unicode_text(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("jsonl") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    assert [d.text for d in read_documents(path)] == texts
    tokenizer = ByteTokenizer()
    assert all(tokenizer.decode(tokenizer.encode(t)) == t for t in texts)


def test_prepared_token_file_holds_exactly_what_loading_the_text_gives(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(TEXT)
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "more text"}\n')
    sidecar = prepare_token_file(tmp_path / "in", tmp_path / "tok.bin", val_fraction=0.2)
    assert (sidecar["dtype"], sidecar["vocab_size"], sidecar["documents"]) == ("uint16", 256, 2)
    assert (tmp_path / "tok.bin").stat().st_size == 2 * sidecar["tokens"]
    from_file = load_corpus(tmp_path / "tok.bin", val_fraction=0.5)  # the sidecar's split wins
    from_text = load_corpus(tmp_path / "in", val_fraction=0.2)
    assert np.array_equal(from_file.train, from_text.train) and np.array_equal(from_file.val, from_text.val)
    assert isinstance(from_file.train, np.memmap)


def test_large_vocabularies_use_uint32_and_a_hand_written_nanogpt_sidecar_works(tmp_path):
    ids = np.array([0, 69_999, 65_536, 5] * 10)
    write_token_file(tmp_path / "big.bin", ids, 70_000, {})
    loaded, sidecar = read_token_file(tmp_path / "big.bin")
    assert sidecar["dtype"] == "uint32" and np.array_equal(loaded, ids)
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")  # as nanoGPT's prepare.py writes it
    sidecar_path(tmp_path / "train.bin").write_text('{"dtype": "uint16", "vocab_size": 50257}')
    corpus = load_corpus(tmp_path / "train.bin", val_fraction=0.1)
    assert (len(corpus.train), len(corpus.val), corpus.vocab_size) == (90, 10, 50257)


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", "", "empty.txt': file is empty"),
    ("blank.txt", "  \n\n", "blank.txt': file is empty"),
    ("latin1.txt", b"ok\nstill ok\ncaf\xe9\n", "latin1.txt': line 3 \\(byte 15\\): not UTF-8 text"),
    ("bad.jsonl", '{"text": "a"}\n{"text": \n', "bad.jsonl': line 2: not valid JSON"),
    ("notext.jsonl", '{"text": "a"}\n{"body": "b"}\n', "notext.jsonl': line 2: text: missing"),
    ("list.jsonl", '["a"]\n', "list.jsonl': line 1: text: missing"),
    ("number.jsonl", '{"text": 5}\n', "number.jsonl': line 1: text: must be a string, got int"),
    ("nothing.jsonl", "\n\n  \n", "nothing.jsonl': file is empty"),
])
def test_bad_text_files_name_the_file_and_line(tmp_path, name, content, message):
    path = _write(tmp_path, name, content)
    with pytest.raises(DataError, match=message):
        load_corpus(path)


def test_bad_token_files_are_refused_with_the_reason(tmp_path):
    np.array([1, 2, 300, 4], dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(DataError, match="no sidecar t.bin.json"):
        load_corpus(tmp_path / "t.bin")
    sidecar_path(tmp_path / "t.bin").write_text('{"dtype": "uint16", "vocab_size": 256}')
    with pytest.raises(DataError, match="token 2: id 300 >= vocab_size 256"):
        load_corpus(tmp_path / "t.bin")
    sidecar_path(tmp_path / "t.bin").write_text('{"dtype": "int8", "vocab_size": 256}')
    with pytest.raises(DataError, match="dtype: must be one of \\['uint16', 'uint32'\\], got 'int8'"):
        load_corpus(tmp_path / "t.bin")
    sidecar_path(tmp_path / "t.bin").write_text('{"dtype": "uint16", "vocab_size": 512, "tokens": 5}')
    with pytest.raises(DataError, match="tokens: sidecar says 5, the file holds 4"):
        load_corpus(tmp_path / "t.bin")
    sidecar_path(tmp_path / "t.bin").write_text('{"dtype": "uint16", "vocab_size": 512, "val_start": 9}')
    with pytest.raises(DataError, match="val_start: must be an integer in 1..4, got 9"):
        load_corpus(tmp_path / "t.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    sidecar_path(tmp_path / "odd.bin").write_text('{"dtype": "uint16", "vocab_size": 256}')
    with pytest.raises(DataError, match="3 bytes is not a whole number of uint16 ids"):
        load_corpus(tmp_path / "odd.bin")
    (tmp_path / "zero.bin").write_bytes(b"")
    sidecar_path(tmp_path / "zero.bin").write_text('{"dtype": "uint16", "vocab_size": 256}')
    with pytest.raises(DataError, match="zero.bin': file is empty"):
        load_corpus(tmp_path / "zero.bin")


def test_short_data_vocab_and_option_errors(tmp_path):
    corpus = load_corpus(_write(tmp_path, "short.txt", "x" * 100), val_fraction=0.1)
    corpus.check_seq_len(9)
    with pytest.raises(DataError, match="the validation split has 10 tokens, fewer than seq_len \\+ 1 = 11"):
        corpus.check_seq_len(10)
    with pytest.raises(DataError, match="vocab_size 256 \\(bytes\\) exceeds the model's vocabulary of 44"):
        corpus.check_vocab(44)
    with pytest.raises(DataError, match="--val-fraction must be in \\[0, 1\\), got 1.0"):
        load_corpus(tmp_path / "short.txt", val_fraction=1.0)
    with pytest.raises(DataError, match="--tokenizer: expected bytes or hf:"):
        load_text_tokenizer("gpt2")
    with pytest.raises(DataError, match="no such local directory"):
        load_text_tokenizer(f"hf:{tmp_path / 'none'}")
    with pytest.raises(DataError, match="no such file or directory"):
        load_corpus(tmp_path / "missing.txt")


def test_a_local_hf_tokenizer_directory_tokenizes_text(tmp_path):
    transformers = pytest.importorskip("transformers", reason="hf: tokenizers need the optional extra geotrain[hf]")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>",
                                         unk_token="<unk>").save_pretrained(tmp_path / "tok")
    _write(tmp_path, "docs.jsonl", '{"text": "the lazy dog"}\n{"text": "the quick fox"}\n')
    sidecar = prepare_token_file(tmp_path / "docs.jsonl", tmp_path / "ids.bin", tokenizer=f"hf:{tmp_path / 'tok'}",
                                 val_fraction=0.0)
    tokenizer = load_text_tokenizer(f"hf:{tmp_path / 'tok'}")
    ids, _ = read_token_file(tmp_path / "ids.bin")
    assert sidecar["vocab_size"] == tokenizer.vocab_size <= 60
    assert tokenizer.separator == (1,) and list(ids).count(1) == 1  # <eos> between the two documents
    assert tokenizer.decode(ids).replace(" ", "") == "thelazydog<eos>thequickfox"


def test_batches_are_a_pure_function_of_seed_step_and_replica():
    tokens = np.arange(1000) % 256
    first = replica_batch(tokens, seed=7, step=3, replica=1, replicas=2, global_batch=8, seq_len=16)
    again = replica_batch(tokens, seed=7, step=3, replica=1, replicas=2, global_batch=8, seq_len=16)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    x, y = first
    assert x.shape == (4, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, replica_batch(tokens, 7, 4, 1, 2, 8, 16)[0])
    assert not torch.equal(x, replica_batch(tokens, 8, 3, 1, 2, 8, 16)[0])
    starts = window_starts(7, 3, len(tokens), 16, 8)
    assert starts.min() >= 0 and starts.max() <= len(tokens) - 17


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_a_replan_to_other_replica_counts_sees_the_same_global_batch(replicas):
    tokens = np.arange(5000) % 251
    reference = replica_batch(tokens, 1, 10, 0, 1, 8, 32)[0]
    parts = [replica_batch(tokens, 1, 10, r, replicas, 8, 32)[0] for r in range(replicas)]
    assert torch.equal(torch.cat(parts), reference)


def test_batch_errors():
    tokens = np.arange(100)
    with pytest.raises(DataError, match="not divisible by 3 replicas"):
        replica_batch(tokens, 0, 0, 0, 3, 8, 16)
    with pytest.raises(DataError, match="replica 2 outside 0..1"):
        replica_batch(tokens, 0, 0, 2, 2, 8, 16)
    with pytest.raises(DataError, match="at least seq_len \\+ 1 = 101 training tokens"):
        replica_batch(tokens, 0, 0, 0, 1, 8, 100)


def test_validation_loss_of_stages_equals_the_unsplit_loss_and_a_direct_computation():
    model = load_model_spec("tiny", ModelOptions(seed=0, vocab_size=256, n_layer=2, context=16))
    val = np.frombuffer(TEXT.encode(), dtype=np.uint8)[:200].astype(np.uint16)
    stages = model.stage_modules(even_boundaries(model.n_layers, 2))
    loss = validation_loss(model.as_module(), val, seq_len=16, batch_size=5)
    assert validation_loss(stages, val, seq_len=16, batch_size=3) == pytest.approx(loss, rel=1e-6)
    windows = torch.from_numpy(val[:12 * 16 + 1].astype(np.int64))
    with torch.no_grad():
        x, y = windows[:-1].view(12, 16), windows[1:].view(12, 16)
        assert loss == pytest.approx(lm_loss(model.as_module()(x), y).item(), rel=1e-6)
    assert abs(loss - math.log(256)) < 0.1  # an untrained model is near uniform
    assert validation_loss(stages, val, seq_len=16, max_windows=2) != loss


def test_data_prepare_cli_writes_the_file_and_reports_json(tmp_path, capsys):
    _write(tmp_path, "in.txt", TEXT)
    assert main(["data", "prepare", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.bin"),
                 "--val-fraction", "0.25", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(TEXT) and report["val_start"] == len(TEXT) - round(0.25 * len(TEXT))
    assert main(["data", "prepare", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.bin")]) == 0
    assert "validation tokens" in capsys.readouterr().out
    _write(tmp_path, "bad.jsonl", "{oops\n")
    assert main(["data", "prepare", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "x.bin")]) == 2
    assert "bad.jsonl': line 1: not valid JSON" in capsys.readouterr().err
