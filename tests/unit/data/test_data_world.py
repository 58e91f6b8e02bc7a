"""The synthetic world and its tokenizer: determinism, alphabet, disjoint split, facts, batches."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.data import ALPHABET, CharTokenizer, TokenizerError, build_world, get_batch, world_tokens


@pytest.fixture(scope="module")
def world():
    return build_world(0)


def test_same_seed_same_text_other_seed_other_text(world):
    again = build_world(0)
    assert again.train_text() == world.train_text() and again.val_text() == world.val_text()
    assert build_world(1).train_text() != world.train_text()


def test_alphabet_has_44_distinct_characters_and_the_text_uses_exactly_them(world):
    assert len(ALPHABET) == 44 and len(set(ALPHABET)) == 44
    assert set(world.train_text()) == set(ALPHABET)
    assert set(world.val_text()) <= set(ALPHABET)


def test_split_is_disjoint_and_about_ten_percent(world):
    assert not set(world.train_documents) & set(world.val_documents)
    n_docs = len(world.train_documents) + len(world.val_documents)
    assert len(world.val_documents) / n_docs == pytest.approx(0.1, abs=0.01)
    # 300 steps x 32 x 96 characters = 0.92 M: a few passes over the training text, not hundreds
    assert 300_000 <= len(world.train_text()) <= 600_000
    assert 25_000 <= len(world.val_text())


def test_sentences_state_the_entities_true_attributes(world):
    people = {p.name: p for p in world.people}
    text = world.train_text() + world.val_text()
    ages = re.findall(r"\b([a-z]+) is (\d+) years old\.", text)
    jobs = re.findall(r"\b([a-z]+) works as a ([a-z]+)\.", text)
    assert len(ages) > 100 and len(jobs) > 100
    for name, age in ages:
        if name in people:  # towns are "N years old" too
            assert people[name].age == int(age)
    assert all(people[name].job == job for name, job in jobs)
    for name, town in re.findall(r"q: where does ([a-z]+) live\? a: in ([a-z]+)\.", text):
        assert people[name].town == town


def test_parents_form_no_cycles(world):
    parent = {p.name: p.parent for p in world.people}
    for name in parent:
        seen = set()
        while name is not None:
            assert name not in seen
            seen.add(name)
            name = parent[name]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=300))
def test_tokenizer_round_trip(text):
    tokenizer = CharTokenizer(ALPHABET)
    ids = tokenizer.encode(text)
    assert len(ids) == len(text) and all(0 <= i < 44 for i in ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(torch.tensor(ids, dtype=torch.long)) == text


def test_tokenizer_names_unknown_character_and_bad_id():
    tokenizer = CharTokenizer()
    with pytest.raises(TokenizerError, match=r"'A' at offset 3"):
        tokenizer.encode("abcA")
    with pytest.raises(TokenizerError, match="44"):
        tokenizer.decode([44])
    with pytest.raises(TokenizerError):
        CharTokenizer("aab")


def test_get_batch_windows_are_shifted_slices_and_seeded():
    tokens = torch.arange(1000)  # distinct values: each window shows where it starts
    x, y = get_batch(tokens, 64, 96, torch.Generator().manual_seed(5))
    assert x.shape == y.shape == (64, 96) and x.dtype == torch.long
    assert torch.equal(x, x[:, :1] + torch.arange(96)) and torch.equal(y, x + 1)
    assert int(y.max()) <= 999 and int(x.min()) >= 0
    assert len(set(x[:, 0].tolist())) > 50
    x2, _ = get_batch(tokens, 64, 96, torch.Generator().manual_seed(5))
    assert torch.equal(x, x2)
    assert get_batch(world_tokens(0).train, 4, 96, torch.Generator())[0].shape == (4, 96)


def test_get_batch_rejects_too_short_text():
    with pytest.raises(TokenizerError):
        get_batch(torch.arange(10), 2, 10, torch.Generator())
