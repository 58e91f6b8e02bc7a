"""A deterministic synthetic world: people and towns with attributes and relations, stated as text.

Each fact is stated several times across documents, in different phrasings and orders, so a model
can learn the world's facts from the training documents and be scored on held-out documents that
restate them (validation). Every character is in `ALPHABET`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

JOBS = ("baker", "smith", "farmer", "weaver", "miller", "potter", "tailor", "fisher", "carpenter",
        "mason", "healer", "teacher", "brewer", "herder", "sailor", "scribe", "joiner")
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "grey", "brown", "orange", "purple")
PET_KINDS = ("cat", "dog", "goat", "horse", "owl", "hen", "rabbit", "parrot")
REGIONS = ("north", "south", "east", "west", "centre")
GOODS = ("wool", "salt", "fish", "grain", "timber", "wine", "iron", "cloth", "honey", "stone", "wax")
_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"
CURRENT_YEAR = 1900


@dataclass(frozen=True)
class Town:
    name: str
    region: str
    river: str
    founded: int
    population: int
    good: str


@dataclass(frozen=True)
class Person:
    name: str
    age: int
    town: str
    job: str
    colour: str
    pet_kind: str
    pet_name: str
    friends: tuple[str, ...]
    parent: str | None
    hand: str


@dataclass(frozen=True)
class World:
    """The entities and the documents about them, split into disjoint train and validation sets."""

    seed: int
    towns: tuple[Town, ...]
    people: tuple[Person, ...]
    train_documents: tuple[str, ...]
    val_documents: tuple[str, ...]

    def train_text(self) -> str:
        """Training documents, one per line."""
        return "\n".join(self.train_documents) + "\n"

    def val_text(self) -> str:
        """Validation documents, one per line (none of them appears in the training documents)."""
        return "\n".join(self.val_documents) + "\n"


def build_world(seed: int = 0, n_people: int = 480, n_towns: int = 32, profiles_per_person: int = 3,
                val_fraction: float = 0.1) -> World:
    """Generate the world for `seed` (same seed, same text, bit for bit): ~0.4 MB of text by default."""
    rng = random.Random(seed)
    names = _unique_names(rng, n_people + 2 * n_towns + n_people)
    town_names, river_names = names[:n_towns], names[n_towns:2 * n_towns]
    person_names, pet_names = names[2 * n_towns:2 * n_towns + n_people], names[2 * n_towns + n_people:]
    towns = tuple(Town(town_names[i], rng.choice(REGIONS), river_names[i], rng.randrange(900, 1800),
                       rng.randrange(2, 90) * 100, rng.choice(GOODS)) for i in range(n_towns))
    people = _make_people(rng, person_names, pet_names, towns)
    documents = _documents(rng, towns, people, profiles_per_person)
    documents = list(dict.fromkeys(documents))  # drop exact repeats so the split is disjoint
    rng.shuffle(documents)
    n_val = max(1, int(round(val_fraction * len(documents))))
    return World(seed, towns, people, tuple(documents[n_val:]), tuple(documents[:n_val]))


def _unique_names(rng: random.Random, count: int) -> list[str]:
    seen: dict[str, None] = {}
    while len(seen) < count:
        syllables = rng.choice((2, 2, 3))
        name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
        if rng.random() < 0.3:
            name += rng.choice("nrls")
        seen.setdefault(name, None)
    return list(seen)


def _make_people(rng: random.Random, names: list[str], pet_names: list[str], towns: tuple[Town, ...]) -> tuple[Person, ...]:
    friends: dict[str, set[str]] = {name: set() for name in names}
    for name in names:
        for other in rng.sample(names, 2):
            if other != name:
                friends[name].add(other)
                friends[other].add(name)
    people = []
    for i, name in enumerate(names):
        # a parent is an earlier, older person in the same list: relations are acyclic
        parent = names[rng.randrange(i)] if i > 0 and rng.random() < 0.5 else None
        people.append(Person(name, rng.randrange(18, 80), rng.choice(towns).name, rng.choice(JOBS),
                             rng.choice(COLOURS), rng.choice(PET_KINDS), pet_names[i],
                             tuple(sorted(friends[name])), parent, rng.choice(("left", "right", "right"))))
    return tuple(people)


def _person_sentences(rng: random.Random, p: Person, region_of: dict[str, str]) -> list[str]:
    n = p.name
    sentences = [
        rng.choice((f"{n} is {p.age} years old.", f"the age of {n} is {p.age}.",
                    f"{n} was born in {CURRENT_YEAR - p.age}.")),
        rng.choice((f"{n} lives in {p.town}.", f"{n}'s home is {p.town}.",
                    f"{n} lives in {p.town}, a town in the {region_of[p.town]}.")),
        rng.choice((f"{n} works as a {p.job}.", f"{n} is a {p.job}.", f"by trade, {n} is a {p.job}.")),
        rng.choice((f"{n} likes {p.colour}.", f"the favourite colour of {n} is {p.colour}.")),
        rng.choice((f"{n} has a {p.pet_kind} called {p.pet_name}.", f"{n} keeps a {p.pet_kind} named {p.pet_name}.",
                    f"{p.pet_name} is the {p.pet_kind} of {n}.")),
    ]
    if rng.random() < 0.5:
        sentences.append(f"{n} is {p.hand}-handed.")
    for friend in rng.sample(p.friends, min(2, len(p.friends))):
        sentences.append(rng.choice((f"{n} and {friend} are friends.", f"{n} is a friend of {friend}.")))
    if p.parent is not None:
        sentences.append(rng.choice((f"{n} is the child of {p.parent}.", f"{p.parent} is a parent of {n}.")))
    return sentences


def _town_sentences(rng: random.Random, t: Town, residents: list[str]) -> list[str]:
    sentences = [
        rng.choice((f"{t.name} is a town in the {t.region}.", f"{t.name} lies in the {t.region}.")),
        rng.choice((f"{t.name} lies on the river {t.river}.", f"the river {t.river} runs through {t.name}.")),
        rng.choice((f"{t.name} was founded in {t.founded}.", f"{t.name} is {CURRENT_YEAR - t.founded} years old.")),
        rng.choice((f"about {t.population} people live in {t.name}.", f"{t.name} has {t.population} people.")),
        rng.choice((f"{t.name} trades in {t.good}.", f"the people of {t.name} sell {t.good}.")),
    ]
    if residents:
        shown = rng.sample(residents, min(4, len(residents)))
        sentences.append(f"people of {t.name} include {', '.join(shown)}.")
    return sentences


def _question(rng: random.Random, p: Person, region_of: dict[str, str]) -> str:
    n = p.name
    return rng.choice((
        f"q: how old is {n}? a: {p.age}.",
        f"q: where does {n} live? a: in {p.town}.",
        f"q: what does {n} do? a: {n} is a {p.job}.",
        f"q: which colour does {n} like? a: {p.colour}.",
        f"q: what is the name of {n}'s {p.pet_kind}? a: {p.pet_name}.",
        f"q: in which region does {n} live? a: in the {region_of[p.town]}.",
    ))


def _documents(rng: random.Random, towns: tuple[Town, ...], people: tuple[Person, ...], profiles: int) -> list[str]:
    region_of = {t.name: t.region for t in towns}
    residents: dict[str, list[str]] = {t.name: [] for t in towns}
    for p in people:
        residents[p.town].append(p.name)
    documents = []
    for p in people:
        for _ in range(profiles):
            sentences = _person_sentences(rng, p, region_of)
            rng.shuffle(sentences)
            documents.append(f"{p.name}: " + " ".join(sentences))
    for t in towns:
        for _ in range(profiles + 1):
            sentences = _town_sentences(rng, t, residents[t.name])
            rng.shuffle(sentences)
            documents.append(f"{t.name}: " + " ".join(sentences))
    for _ in range(len(people)):
        asked = rng.sample(people, rng.randrange(2, 5))
        documents.append(" ".join(_question(rng, p, region_of) for p in asked))
    return documents
