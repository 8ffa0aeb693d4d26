"""Reading back what a bench run wrote (shared by the bench tests)."""

import csv
import json


def csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def json_rows(path):
    with open(path) as f:
        return json.load(f)["rows"]
