"""Offline ART-E generator: synthetic company inboxes with planted facts and questions about them.

A corpus has ``n_inboxes`` owners and a pool of colleagues and outside contacts. Each inbox gets threads
(an opening email plus 0-2 replies "Re: ...") over one year: fact threads, whose opening email plants one
fact (a flight confirmation code, a meeting room, a budget, a phone number, a deadline, a restaurant),
and chatter threads. Facts of one kind differ by a key (city, project, person) so that a question must
name the key; the other facts of the same kind act as distractors. Each fact gives one question whose
answer is the planted value (with accepted variants) and whose source is the opening email's message id.

Difficulty is in the phrasing: ``easy`` names the sender and the month, ``medium`` names the topic and
key, ``hard`` paraphrases the topic word (e.g. "trip" for "flight") so the first keyword guess misses.
Everything is a pure function of ``InboxParams`` (seeded ``random.Random``).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.arte.db import DATE_FMT, EmailRecord

GENERATOR_VERSION = "arte-inbox-v1"

_FIRST = ["Alice", "Brian", "Carla", "Derek", "Elena", "Frank", "Grace", "Hector", "Irene", "Jonas", "Karen",
          "Liam", "Maya", "Nolan", "Olga", "Pavel", "Quinn", "Rosa", "Simon", "Tara", "Umar", "Vera", "Wade",
          "Xenia", "Yusuf", "Zoe", "Abel", "Bianca", "Cyrus", "Dalia", "Emil", "Fiona"]
_LAST = ["Archer", "Benson", "Castillo", "Dorsey", "Ellison", "Fairbanks", "Garrity", "Holloway", "Ingram",
         "Jessup", "Kowalski", "Lindqvist", "Marsh", "Novak", "Okafor", "Pruitt", "Quade", "Rourke", "Sandoval",
         "Thorne", "Underhill", "Valdez", "Whitlock", "Yates", "Zamora", "Abernathy", "Brandt", "Colby"]
_CITIES = ["Houston", "Denver", "Portland", "Calgary", "Omaha", "Tulsa", "Boise", "Phoenix", "Raleigh",
           "Memphis", "Fresno", "Spokane", "Tucson", "Wichita", "Albany", "Madison", "Reno", "Austin"]
_PROJECTS = ["Falcon", "Bluebird", "Granite", "Meridian", "Keystone", "Juniper", "Cobalt", "Harbor",
             "Summit", "Trident", "Mosaic", "Pioneer", "Sierra", "Lantern", "Orchid", "Vanguard"]
_RESTAURANTS = ["Brennan's", "The Blue Oyster", "Casa Olivo", "Saffron House", "The Copper Pot",
                "Little Lisbon", "Maple & Vine", "The Grill Room", "Sakura Garden", "Trattoria Nona"]
_CHATTER = [
    ("Lunch tomorrow?", "Are you free for lunch tomorrow? I was thinking somewhere near the office."),
    ("Fantasy football", "Trade offer stands. Let me know before the weekend."),
    ("Printer on 32", "The printer on the 32nd floor is jammed again, IT has been called."),
    ("Quarterly numbers", "Please send me your quarterly numbers when you get a chance."),
    ("Parking garage", "Reminder that the parking garage will be closed for repairs next week."),
    ("Conference call", "Moving our conference call to the afternoon, same dial-in as usual."),
    ("Happy birthday", "Cake in the break room at 3. Don't tell him!"),
    ("Gas storage report", "Attached is the weekly gas storage report for your review."),
    ("Trading floor move", "Facilities confirmed the trading floor move happens over the holiday."),
    ("Expense reports", "Expense reports are due to accounting by the end of the month."),
]
_REPLIES = ["Thanks, noted.", "Got it, thanks!", "Sounds good to me.", "Will do.", "Thanks for the update.",
            "Can we discuss this on Monday?"]
_DOMAINS = ["enronsynth.com", "enronsynth.com", "enronsynth.com", "gasco.com", "powerlaw.com", "travelhub.com"]


class InboxParams(BaseModel):
    """Parameters of one synthetic ART-E corpus; the corpus is a pure function of them."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="Seed of people, threads, facts and dates.")
    n_inboxes: int = Field(6, ge=1, le=400, description="Inbox owners (one question set each).")
    n_contacts: int = Field(30, ge=4, description="Colleagues and outside contacts.")
    facts_per_inbox: int = Field(24, ge=1, le=60, description="Fact threads per inbox (one question each).")
    chatter_per_inbox: int = Field(40, ge=0, description="Threads without a fact, per inbox.")
    start_date: str = Field("2001-01-01", description="First possible email date (YYYY-MM-DD).")
    days: int = Field(365, ge=30, description="Length of the period the emails span, days.")


class PlantedFact(BaseModel):
    """A fact planted in one email and the question about it."""

    fact_id: str
    inbox: str
    kind: str
    question: dict[str, str]  # difficulty -> question text
    answer: str
    answers: list[str]
    message_ids: list[str]
    keywords: list[str]  # a search that finds the source email (for tests and the scripted expert)
    pattern: str  # regex whose group 1 is the answer in the source email's body (scripted expert)
    query_date: str
    how_realistic: float


class SynthCorpus(BaseModel):
    """All emails and facts of one synthetic corpus."""

    params: InboxParams
    inboxes: list[str]
    emails: list[EmailRecord]
    facts: list[PlantedFact]


def _fmt_money(v: int) -> str:
    return f"${v:,}"


def _fact(kind: str, rng: random.Random, key: str, when: datetime) -> dict[str, Any]:
    """Subject, body sentence, answer, accepted variants and questions (by difficulty) of one fact."""
    if kind == "flight":
        code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
        return {"subject": f"Flight to {key} confirmed",
                "body": f"Your flight to {key} is booked. The confirmation code is {code}.",
                "answer": code, "answers": [code], "keywords": [key, "confirmation"],
                "pattern": r"confirmation code is ([A-Z0-9]+)",
                "q": {"medium": f"What is the confirmation code for my flight to {key}?",
                      "hard": f"What booking reference did I get for my trip to {key}?"}}
    if kind == "room":
        room = f"{rng.choice('ABCDE')}{rng.randint(2, 49)}{rng.randint(0, 3)}{rng.randint(0, 9)}"
        return {"subject": f"Project {key} review meeting",
                "body": f"The project {key} review meeting will be held in room {room}.",
                "answer": f"Room {room}", "answers": [f"Room {room}", room], "keywords": [key, "review", "room"],
                "pattern": r"held in (room [A-Z0-9]+)",
                "q": {"medium": f"Which room is the project {key} review meeting in?",
                      "hard": f"Where is the {key} review being held?"}}
    if kind == "budget":
        v = rng.randint(20, 990) * 5_000
        return {"subject": f"Project {key} budget approved",
                "body": f"Good news: the approved budget for project {key} is {_fmt_money(v)}.",
                "answer": _fmt_money(v), "answers": [_fmt_money(v), f"{v:,}", str(v), f"${v}", f"{v} dollars"],
                "keywords": [key, "budget"], "pattern": r"budget for project \w+ is (\$[0-9,]+)",
                "q": {"medium": f"What is the approved budget for project {key}?",
                      "hard": f"How much money was signed off for {key}?"}}
    if kind == "phone":
        num = f"713-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}"
        return {"subject": "My new number",
                "body": f"I have a new cell phone. You can reach {key} at {num} from now on.",
                "answer": num, "answers": [num, num.replace("-", ""), f"({num[:3]}) {num[4:]}"],
                "keywords": [key, "phone"], "pattern": r"at ([0-9-]+) from now on",
                "q": {"medium": f"What is {key}'s new cell phone number?",
                      "hard": f"How can I call {key} on their mobile now?"}}
    if kind == "deadline":
        d = when + timedelta(days=rng.randint(7, 90))
        long = f"{d:%B} {d.day}, {d.year}"
        return {"subject": f"Project {key} report deadline",
                "body": f"Reminder: the project {key} report is due on {long}.",
                "answer": long, "answers": [long, f"{d:%Y-%m-%d}", f"{d.day} {d:%B} {d.year}",
                                            f"{d:%B} {d.day} {d.year}"],
                "keywords": [key, "report", "due"], "pattern": r"is due on ([A-Za-z]+ [0-9]+, [0-9]{4})",
                "q": {"medium": f"When is the project {key} report due?",
                      "hard": f"What is the last day to hand in the {key} write-up?"}}
    if kind != "dinner":
        raise ValueError(f"unknown fact kind {kind!r}")
    place = rng.choice(_RESTAURANTS)
    return {"subject": f"Dinner with the {key} team",
            "body": f"I booked a table at {place} for the {key} team dinner on Friday.",
            "answer": place, "answers": [place], "keywords": [key, "dinner"],
            "pattern": r"table at (.+?) for the",
            "q": {"medium": f"Which restaurant was booked for the {key} team dinner?",
                  "hard": f"Where are we eating with the {key} people?"}}


def generate_corpus(params: InboxParams) -> SynthCorpus:
    """Generate inboxes, emails and planted facts of ``params`` (deterministic)."""
    rng = random.Random(f"{GENERATOR_VERSION}:{params.seed}")
    names = [(f, l) for f in _FIRST for l in _LAST]
    rng.shuffle(names)
    people = []
    for i, (f, l) in enumerate(names[: params.n_inboxes + params.n_contacts]):
        domain = "enronsynth.com" if i < params.n_inboxes else rng.choice(_DOMAINS)
        people.append({"name": f"{f} {l}", "first": f, "addr": f"{f.lower()}.{l.lower()}@{domain}"})
    owners, contacts = people[: params.n_inboxes], people[params.n_inboxes:]
    start = datetime.strptime(params.start_date, "%Y-%m-%d")
    emails: list[EmailRecord] = []
    facts: list[PlantedFact] = []
    seq = 0

    def new_id() -> str:
        nonlocal seq
        seq += 1
        return f"<{seq}.{rng.randint(10**12, 10**13 - 1)}.JavaMail.synth@mailhub>"

    def thread(owner: dict, subject: str, body: str, when: datetime, sender: dict, others: list[dict]) -> str:
        """Opening email (owner in to/cc/bcc or as sender) plus 0-2 replies; returns the opening id."""
        if sender is owner:
            to, cc, bcc = [others[0]["addr"]], [o["addr"] for o in others[1:2]], []
        else:
            r = rng.random()
            to = [owner["addr"]] if r < 0.7 else [others[0]["addr"]]
            cc = [] if r < 0.7 else [owner["addr"]] if r < 0.9 else []
            bcc = [owner["addr"]] if r >= 0.9 else []
            if len(others) > 1 and rng.random() < 0.5:
                cc.append(others[1]["addr"])
        mid = new_id()
        emails.append(EmailRecord(message_id=mid, subject=subject, **{"from": sender["addr"]}, to=to, cc=cc, bcc=bcc,
                                  date=when.strftime(DATE_FMT),
                                  body=f"Hi,\n\n{body}\n\nBest,\n{sender['first']}",
                                  file_name=f"{owner['addr'].split('@')[0]}/inbox/{seq}."))
        t = when
        for _ in range(rng.choice([0, 0, 1, 2])):
            t = t + timedelta(hours=rng.randint(1, 48))
            replier = owner if sender is not owner else others[0]
            target = sender if replier is owner else owner
            emails.append(EmailRecord(message_id=new_id(), subject=f"Re: {subject}", **{"from": replier["addr"]},
                                      to=[target["addr"]], date=t.strftime(DATE_FMT),
                                      body=f"{rng.choice(_REPLIES)}\n\n{replier['first']}",
                                      file_name=f"{owner['addr'].split('@')[0]}/inbox/{seq}."))
        return mid

    kinds = ["flight", "room", "budget", "phone", "deadline", "dinner"]
    for oi, owner in enumerate(owners):
        used: dict[str, set[str]] = {k: set() for k in kinds}
        for fi in range(params.facts_per_inbox):
            kind = kinds[fi % len(kinds)]
            pool = {"flight": _CITIES, "room": _PROJECTS, "budget": _PROJECTS, "deadline": _PROJECTS,
                    "phone": [c["name"] for c in contacts], "dinner": _PROJECTS}[kind]
            free = [k for k in pool if k not in used[kind]]
            if not free:
                continue
            key = rng.choice(free)
            used[kind].add(key)
            sender = rng.choice(contacts)
            if kind == "phone":
                sender = next(c for c in contacts if c["name"] == key)
            when = start + timedelta(days=rng.randint(0, params.days - 1), hours=rng.randint(7, 19),
                                     minutes=rng.randint(0, 59))
            f = _fact(kind, rng, key, when)
            others = rng.sample([c for c in contacts if c is not sender], 2)
            mid = thread(owner, f["subject"], f["body"], when, sender, others)
            month = f"{when:%B} {when.year}"
            easy = f["q"]["medium"].rstrip("?") + f" ({sender['name']} emailed about it in {month})?"
            qdate = when + timedelta(days=rng.randint(1, 60))
            facts.append(PlantedFact(
                fact_id=f"i{oi}-f{fi}", inbox=owner["addr"], kind=kind,
                question={"easy": easy, "medium": f["q"]["medium"], "hard": f["q"]["hard"]},
                answer=f["answer"], answers=f["answers"], message_ids=[mid],
                keywords=f["keywords"], pattern=f["pattern"], query_date=qdate.strftime("%Y-%m-%d"),
                how_realistic=round(rng.uniform(0.5, 1.0), 2)))
        for _ in range(params.chatter_per_inbox):
            subject, body = rng.choice(_CHATTER)
            sender = owner if rng.random() < 0.3 else rng.choice(contacts + owners)
            # a sender who owns another inbox makes the thread visible in both inboxes
            others = rng.sample([c for c in contacts if c is not sender], 2)
            when = start + timedelta(days=rng.randint(0, params.days - 1), hours=rng.randint(7, 19))
            thread(owner, subject, body, when, sender, others)
    return SynthCorpus(params=params, inboxes=[o["addr"] for o in owners], emails=emails, facts=facts)
