"""Offline DeepDive generator: a synthetic knowledge graph, one web page per entity, k-hop questions.

Procedure (after the DeepDive paper's data recipe, spec ``benchmarks.md`` section 3):

1. Entities of six types (person, city, company, university, river, mountain), each with a unique name,
   one or two aliases, typed attributes (years, counts, country, occupation, industry) and *functional*
   typed relations (every entity has exactly one target per relation, e.g. ``born_in``), so a chain of
   relations from a start entity names exactly one entity at every hop.
2. One page per entity: a title, an "Also known as" line, a fact box (attributes and links
   ``Name [page-id]``) and prose that repeats the facts among distractor sentences mentioning other
   entities, so that plain keyword search is not enough to answer.
3. A question is a random walk of ``k`` hops without revisits, from a start entity described by an
   obfuscated clue (an alias plus a fuzzy attribute such as a birth decade), through relation clues that
   never name the intermediate entities, ending in an attribute of the last entity (the answer).

Departures from the real data set: the graph, pages and questions are synthetic (no LLM rewriting of the
question), the start entity is found through its alias, and answers come with aliases so that exact
matching works without a judge. Everything is a pure function of the parameters (seeded ``random.Random``).
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GENERATOR_VERSION = "deepdive-kg-v1"

# type -> relation -> target type. Every relation is functional (exactly one target).
RELATIONS: dict[str, dict[str, str]] = {
    "person": {"born_in": "city", "employer": "company", "alma_mater": "university", "mentor": "person"},
    "city": {"lies_on": "river", "mayor": "person", "twin_city": "city"},
    "company": {"headquarters": "city", "founder": "person"},
    "university": {"located_in": "city", "first_rector": "person"},
    "river": {"source_on": "mountain", "mouth_city": "city"},
    "mountain": {"first_climbed_by": "person", "nearest_city": "city"},
}
ATTRIBUTES: dict[str, list[str]] = {
    "person": ["birth_year", "occupation"],
    "city": ["population", "founded_year", "country"],
    "company": ["founded_year", "industry", "employees"],
    "university": ["founded_year", "students"],
    "river": ["length_km"],
    "mountain": ["elevation_m", "first_ascent_year"],
}
#: Fact-box label of every relation and attribute (pages print ``- Label: value``).
LABELS: dict[str, str] = {
    "born_in": "Born in", "employer": "Employer", "alma_mater": "Alma mater", "mentor": "Mentor",
    "lies_on": "River", "mayor": "Mayor", "twin_city": "Twin city", "headquarters": "Headquarters",
    "founder": "Founder", "located_in": "Location", "first_rector": "First rector", "source_on": "Source",
    "mouth_city": "Mouth", "first_climbed_by": "First ascent by", "nearest_city": "Nearest city",
    "birth_year": "Born", "occupation": "Occupation", "population": "Population",
    "founded_year": "Founded", "country": "Country", "industry": "Industry", "employees": "Employees",
    "students": "Students", "length_km": "Length (km)", "elevation_m": "Elevation (m)",
    "first_ascent_year": "First ascent",
}
# Relation clue: how the next hop is described without naming it.
HOP_CLUES: dict[str, str] = {
    "born_in": "the city where this person was born",
    "employer": "the company this person works for",
    "alma_mater": "the university this person graduated from",
    "mentor": "this person's mentor",
    "lies_on": "the river this city lies on",
    "mayor": "the mayor of this city",
    "twin_city": "this city's twin city",
    "headquarters": "the city where this company has its headquarters",
    "founder": "the founder of this company",
    "located_in": "the city this university is in",
    "first_rector": "the first rector of this university",
    "source_on": "the mountain where this river rises",
    "mouth_city": "the city at the mouth of this river",
    "first_climbed_by": "the first person to climb this mountain",
    "nearest_city": "the city nearest to this mountain",
}
ASK: dict[str, str] = {
    "birth_year": "In what year was this person born?",
    "occupation": "What is this person's occupation?",
    "population": "What is the population of this city?",
    "founded_year": "In what year was it founded?",
    "country": "In which country is this city?",
    "industry": "In which industry does this company work?",
    "employees": "How many employees does this company have?",
    "students": "How many students does this university have?",
    "length_km": "How long is this river, in kilometres?",
    "elevation_m": "What is the elevation of this mountain, in metres?",
    "first_ascent_year": "In what year was this mountain first climbed?",
}
_OCCUPATIONS = ["glassblower", "cartographer", "violinist", "botanist", "stonemason", "astronomer",
                "bookbinder", "architect", "beekeeper", "chemist", "sculptor", "shipwright", "linguist",
                "clockmaker", "geologist", "tailor", "poet", "surgeon", "engraver", "perfumer"]
_INDUSTRIES = ["shipping", "textiles", "optics", "mining", "publishing", "brewing", "aviation",
               "pharmaceuticals", "ceramics", "railways", "insurance", "robotics"]
_ADJ = ["Quiet", "Amber", "Iron", "Silver", "Patient", "Crimson", "Lantern", "Northern", "Hollow",
        "Restless", "Velvet", "Copper", "Winter", "Gilded", "Salt", "Ashen", "Bright", "Stubborn"]
_NOUN = ["Heron", "Compass", "Owl", "Anvil", "Willow", "Falcon", "Harbour", "Needle", "Beacon", "Fox",
         "Kettle", "Lark", "Quill", "Badger", "Orchard", "Tide", "Marten", "Bell"]
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr",
           "st", "th", "sh", "gr", "tr", "vel", "mor"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "n", "r", "s", "l", "th", "nd", "sk", "m"]
_FILLER = [
    "Local archives hold letters about {other} from the same period.",
    "A small exhibition in {other_city} once covered this subject.",
    "Historians still debate the role of {other} in these events.",
    "The regional almanac lists {other} in a neighbouring entry.",
    "Travel guides often mention {other_city} on the same route.",
    "Several photographs from {other_city} show related scenes.",
]


class CorpusParams(BaseModel):
    """Parameters of one synthetic DeepDive corpus; the corpus is a pure function of them."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="Seed of the knowledge graph and its pages.")
    n_people: int = Field(240, ge=8, description="Number of person entities.")
    n_cities: int = Field(80, ge=4, description="Number of city entities.")
    n_companies: int = Field(80, ge=2, description="Number of company entities.")
    n_universities: int = Field(40, ge=2, description="Number of university entities.")
    n_rivers: int = Field(40, ge=2, description="Number of river entities.")
    n_mountains: int = Field(40, ge=2, description="Number of mountain entities.")
    n_countries: int = Field(12, ge=2, description="Number of distinct country names.")
    filler_sentences: int = Field(4, ge=0, description="Distractor sentences per page.")

    def counts(self) -> dict[str, int]:
        """Entities per type."""
        return {"person": self.n_people, "city": self.n_cities, "company": self.n_companies,
                "university": self.n_universities, "river": self.n_rivers, "mountain": self.n_mountains}


class Entity(BaseModel):
    """One knowledge-graph node; ``id`` is also its page id (``<type>-<index:04d>``)."""

    id: str
    type: str
    name: str
    aliases: list[str]
    attributes: dict[str, Any]
    relations: dict[str, str]  # relation -> target entity id


class Page(BaseModel):
    """A generated web page: ``id`` (page id), ``title``, ``text`` (markdown-like), ``url``."""

    id: str
    title: str
    text: str
    url: str = ""


class KnowledgeGraph(BaseModel):
    """All entities of one corpus, by id."""

    params: CorpusParams
    entities: dict[str, Entity]
    countries: dict[str, list[str]]  # country -> aliases

    def ids_of(self, etype: str) -> list[str]:
        """Entity ids of one type, in index order."""
        return [e for e in self.entities if self.entities[e].type == etype]


class _Names:
    """Unique pronounceable words from a seeded RNG."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int | None = None) -> str:
        for _ in range(1000):
            n = syllables or self.rng.choice([2, 2, 3])
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n))
            w = (w + self.rng.choice(_CODAS)).capitalize()
            if w.lower() not in self.used and len(w) >= 4:
                self.used.add(w.lower())
                return w
        raise RuntimeError("name generator exhausted")  # pragma: no cover


def fmt_value(attr: str, value: Any) -> str:
    """How an attribute value is printed on a page and given as the reference answer."""
    if attr in ("population", "employees", "students", "length_km", "elevation_m"):
        return f"{value:,}"
    return str(value)


def answer_aliases(attr: str, value: Any, kg: KnowledgeGraph) -> list[str]:
    """Reference answer first, then accepted variants (digit grouping, units, country aliases)."""
    main = fmt_value(attr, value)
    out = [main]
    if isinstance(value, int):
        out.append(str(value))
        unit = {"length_km": "km", "elevation_m": "m", "population": "people", "employees": "employees",
                "students": "students"}.get(attr)
        if unit:
            out += [f"{main} {unit}", f"{value} {unit}"]
    if attr == "country":
        out += kg.countries.get(value, [])
    return list(dict.fromkeys(out))


def build_graph(params: CorpusParams) -> KnowledgeGraph:
    """Generate the knowledge graph of ``params`` (deterministic)."""
    rng = random.Random(f"{GENERATOR_VERSION}:{params.seed}")
    names = _Names(rng)
    countries = {c: [f"Republic of {c}"] for c in (names.word(3) for _ in range(params.n_countries))}
    counts = params.counts()
    ids = {t: [f"{t}-{i:04d}" for i in range(n)] for t, n in counts.items()}
    used_nick: set[tuple[str, str]] = set()
    entities: dict[str, Entity] = {}
    for etype, eids in ids.items():
        for eid in eids:
            attrs: dict[str, Any] = {}
            if etype == "person":
                first, last = names.word(2), names.word()
                name = f"{first} {last}"
                while True:
                    pair = (rng.choice(_ADJ), rng.choice(_NOUN))
                    if pair not in used_nick or len(used_nick) >= len(_ADJ) * len(_NOUN):
                        break
                used_nick.add(pair)
                aliases = [f"the {pair[0]} {pair[1]} of {names.word(2)}", f"{first[0]}. {last}"]
                attrs = {"birth_year": rng.randint(1890, 1990), "occupation": rng.choice(_OCCUPATIONS)}
            elif etype == "city":
                name = names.word()
                aliases = [f"{names.word()} (historical name)"]
                attrs = {"population": rng.randint(2_000, 900_000), "founded_year": rng.randint(900, 1850),
                         "country": rng.choice(sorted(countries))}
            elif etype == "company":
                name = f"{names.word()} {rng.choice(['Works', 'Group', 'Industries', 'and Sons', 'Labs'])}"
                aliases = [f"{names.word()} Holdings"]
                attrs = {"founded_year": rng.randint(1850, 2015), "industry": rng.choice(_INDUSTRIES),
                         "employees": rng.randint(12, 90_000)}
            elif etype == "university":
                name = f"{names.word()} University"
                aliases = [f"{names.word()} College"]
                attrs = {"founded_year": rng.randint(1200, 1990), "students": rng.randint(800, 60_000)}
            elif etype == "river":
                name = f"{names.word()} River"
                aliases = [f"the {names.word()} Water"]
                attrs = {"length_km": rng.randint(40, 3_200)}
            else:  # mountain
                name = f"Mount {names.word()}"
                aliases = [f"{names.word()} Peak"]
                attrs = {"elevation_m": rng.randint(900, 8_400), "first_ascent_year": rng.randint(1780, 1990)}
            rels = {rel: rng.choice([t for t in ids[ttype] if t != eid]) for rel, ttype in RELATIONS[etype].items()}
            entities[eid] = Entity(id=eid, type=etype, name=name, aliases=aliases, attributes=attrs,
                                   relations=rels)
    return KnowledgeGraph(params=params, entities=entities, countries=countries)


def _prose(e: Entity, kg: KnowledgeGraph, rng: random.Random) -> list[str]:
    n = lambda rel: kg.entities[e.relations[rel]].name  # noqa: E731
    a = e.attributes
    if e.type == "person":
        s = [f"{e.name} (born {a['birth_year']}) is a {a['occupation']} from {n('born_in')}.",
             f"{e.name} studied at {n('alma_mater')} under the guidance of {n('mentor')}.",
             f"Later {e.name} joined {n('employer')}."]
    elif e.type == "city":
        s = [f"{e.name} is a city in {a['country']} founded in {a['founded_year']}.",
             f"It lies on the {n('lies_on')} and has a population of {fmt_value('population', a['population'])}.",
             f"The current mayor is {n('mayor')}; its twin city is {n('twin_city')}."]
    elif e.type == "company":
        s = [f"{e.name} is a {a['industry']} company founded in {a['founded_year']} by {n('founder')}.",
             f"It is headquartered in {n('headquarters')} and employs {fmt_value('employees', a['employees'])} people."]
    elif e.type == "university":
        s = [f"{e.name} was founded in {a['founded_year']} in {n('located_in')}.",
             f"Its first rector was {n('first_rector')}; today it has {fmt_value('students', a['students'])} students."]
    elif e.type == "river":
        s = [f"The {e.name} is {fmt_value('length_km', a['length_km'])} km long.",
             f"It rises on {n('source_on')} and reaches the sea at {n('mouth_city')}."]
    else:
        s = [f"{e.name} rises to {fmt_value('elevation_m', a['elevation_m'])} m near {n('nearest_city')}.",
             f"It was first climbed in {a['first_ascent_year']} by {n('first_climbed_by')}."]
    all_ids = list(kg.entities)
    city_ids = kg.ids_of("city")
    for _ in range(kg.params.filler_sentences):
        tmpl = rng.choice(_FILLER)
        s.append(tmpl.format(other=kg.entities[rng.choice(all_ids)].name,
                             other_city=kg.entities[rng.choice(city_ids)].name))
    rng.shuffle(s)
    return s


def render_pages(kg: KnowledgeGraph) -> list[Page]:
    """One page per entity, in id order. Fact lines look like ``- Born in: Velmora [city-0012]``."""
    rng = random.Random(f"{GENERATOR_VERSION}:pages:{kg.params.seed}")
    pages = []
    for e in kg.entities.values():
        lines = [f"# {e.name}", f"Type: {e.type}", f"Also known as: {'; '.join(e.aliases)}", "", "## Facts"]
        lines += [f"- {LABELS[attr]}: {fmt_value(attr, v)}" for attr, v in e.attributes.items()]
        lines += [f"- {LABELS[rel]}: {kg.entities[tid].name} [{tid}]" for rel, tid in e.relations.items()]
        lines += ["", "## Description", " ".join(_prose(e, kg, rng))]
        pages.append(Page(id=e.id, title=e.name, text="\n".join(lines), url=f"https://deepdive.local/{e.id}"))
    return pages


class WalkQuestion(BaseModel):
    """A k-hop question with its gold path. ``path`` has k+1 entity ids (start .. answer entity)."""

    question: str
    answer: str
    answers: list[str]
    hops: int
    path: list[str]
    relations: list[str]
    attribute: str
    start_query: str  # the search query that finds the start page (its alias)


def _start_clue(e: Entity) -> str:
    a = e.attributes
    alias = e.aliases[0]
    if e.type == "person":
        return f"a {a['occupation']} born in the {a['birth_year'] // 10 * 10}s, nicknamed \"{alias}\""
    if e.type == "city":
        return f"a city in {a['country']} once called \"{alias.split(' (')[0]}\""
    if e.type == "company":
        return f"a {a['industry']} company also trading as \"{alias}\""
    if e.type == "university":
        return f"a university founded in the {a['founded_year'] // 100 + 1}th century, formerly \"{alias}\""
    if e.type == "river":
        return f"a river also called \"{alias}\""
    return f"a mountain also called \"{alias}\""


def start_query(e: Entity) -> str:
    """The query that finds the start entity's page: its first alias without decorations."""
    return e.aliases[0].split(" (")[0]


def random_walk_question(kg: KnowledgeGraph, rng: random.Random, hops: int,
                         start_ids: list[str]) -> WalkQuestion:
    """Sample a ``hops``-hop walk without revisits from one of ``start_ids`` and phrase it as a question.

    Raises RuntimeError when no such walk is found in 1000 tries (graph too small for ``hops``).
    """
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    for _ in range(1000):
        cur = rng.choice(start_ids)
        path, rels = [cur], []
        while len(rels) < hops:
            e = kg.entities[cur]
            options = [r for r in sorted(e.relations) if e.relations[r] not in path]
            if not options:
                break
            r = rng.choice(options)
            rels.append(r)
            cur = e.relations[r]
            path.append(cur)
        if len(rels) == hops:
            break
    else:
        raise RuntimeError(f"no {hops}-hop walk found; use a larger corpus")
    last = kg.entities[path[-1]]
    attr = rng.choice(ATTRIBUTES[last.type])
    start = kg.entities[path[0]]
    parts = [f"Start from {_start_clue(start)}."]
    for i, r in enumerate(rels):
        parts.append(("Consider " if i == 0 else "Then take ") + HOP_CLUES[r] + ".")
    parts.append(ASK[attr])
    answers = answer_aliases(attr, last.attributes[attr], kg)
    return WalkQuestion(question=" ".join(parts), answer=answers[0], answers=answers, hops=hops, path=path,
                        relations=rels, attribute=attr, start_query=start_query(start))
