#!/usr/bin/env python3
"""Writes a batch job of many questions over one long document (bench/RESULTS.md, "Shared
prefixes"): a report of about WORDS words of varied English sentences with facts planted in it,
then one request per question (20-40 tokens each), as sift --prompts JSON Lines.

    python3 bench/prefix_job.py OUT.jsonl [--words 6000] [--questions 32] [--chat]
"""
import argparse
import json
import random

SUBJECTS = ["The council", "A merchant", "The harbor master", "Our committee", "The old tower",
            "Each ship", "The river", "A letter from the mayor", "The winter market", "The garden"]
VERBS = ["recorded", "reported", "described", "questioned", "approved", "delayed", "measured",
         "repaired", "announced", "rejected"]
OBJECTS = ["the new bridge tolls", "a shipment of copper", "the flood of the east quarter",
           "repairs to the north wall", "the price of grain", "a dispute over fishing rights",
           "the census of the lower town", "the lamp oil reserves", "an audit of the treasury",
           "the schedule of the ferries"]
TAILS = ["before the spring rains.", "after a long debate.", "without any objection.",
         "for the third time this year.", "in the presence of witnesses.",
         "at the request of the guilds.", "despite the cold weather.", "on a Tuesday morning."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--words", type=int, default=6000)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chat", action="store_true")
    a = ap.parse_args()
    r = random.Random(a.seed)
    facts = [(f"item {i}", r.randint(1000, 9999)) for i in range(a.questions)]
    sentences, n = [], 0
    while n < a.words:
        s = f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)} {r.choice(TAILS)}"
        sentences.append(s)
        n += len(s.split())
    for k, (name, v) in enumerate(facts):   # planted facts, spread through the report
        sentences.insert(r.randrange(len(sentences)), f"The registry number of {name} is {v}.")
    doc = "Annual report of the harbor town.\n\n" + " ".join(sentences) + "\n\n"
    with open(a.out, "w") as f:
        for i, (name, _) in enumerate(facts):
            q = (f"Question {i + 1}: according to the report above, what is the registry number "
                 f"of {name}? Answer with the number only, then one short sentence on where it "
                 f"appears.")
            req = {"id": f"q{i + 1}", "prompt": doc + q + "\nAnswer:"}
            if a.chat:
                req = {"id": f"q{i + 1}", "messages": [{"role": "user", "content": doc + q}]}
            f.write(json.dumps(req) + "\n")


if __name__ == "__main__":
    main()
