#!/usr/bin/env python3
"""count.py STATS FILE...: of the task ids in the submitter summaries FILE..., how many the
executor's /stats (STATS) saw, and how many more than once. Exits 1 if any is missing."""
import json
import sys

stats = json.load(open(sys.argv[1]))
ids = [i for f in sys.argv[2:] for i in json.load(open(f))["ids"]]
missing = [i for i in ids if i not in stats["ids"]]
dups = sum(stats["ids"][i] - 1 for i in ids if i in stats["ids"])
print(f"count: {len(ids)} submitted, {len(ids) - len(missing)} executed, {len(missing)} missing, "
      f"{dups} executed more than once")
if missing:
    print("missing: " + " ".join(missing[:5]))
sys.exit(1 if missing else 0)
