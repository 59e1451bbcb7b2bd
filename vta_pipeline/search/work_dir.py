"""A tuning task's work dir: the one place that names the files in it and the states it records.

Every module that reads or writes a work dir (the search, the trial log, re-time, the
records library's seeds, space upgrades, workload-key migrations, the tune step's artifact)
takes the names from here, so a file is never spelled two ways and a reader finds every
file of a work dir on one page. The names are in every store already made: renaming one
strands what the stores hold.
"""

from __future__ import annotations

from enum import StrEnum


class WorkDir:
    """The names of a work dir's files (`trial_log.task_work_dir` gives its path)."""

    TRIALS = "trials.jsonl"  # every measurement, append-only: the record the rest is derived from
    STATE = "state.json"  # the search's state: its space label, trials done, why it stopped
    DEFAULT = "default.json"  # the untuned (default) lowering's time on the same board
    RETIMED = "retimed.json"  # the best records measured again, in turn, after the search
    WARM_START = "warm_start.json"  # what the task was seeded with (earlier sessions, the library, an upgrade)
    LIBRARY_SEEDS = "library_seeds.json"  # the records library's seeds, measured before the search
    RECORDS = "database_tuning_record.json"  # MetaSchedule's JSON database: its records...
    WORKLOADS = "database_workload.json"  # ...and its workloads
    SUMMARY = "summary.json"  # a finished task's outcome (in the tune step's artifact)


class Status(StrEnum):
    """A task's `status` in its state file: where its search stands."""

    TUNING = "tuning"  # a search is running or was cut off (resumed by the next run)
    FINISHED = "finished"  # the search ended (see `Stopped`); a bigger budget may search on
    FAILED = "failed"  # every measurement failed: the board or the build, not the space


class Stopped(StrEnum):
    """Why a search ended (`stopped` in the state file and the task's outcome), or stops."""

    BUDGET = "budget"  # its trials were spent: a bigger budget searches on
    EARLY_STOPPING = "early-stopping"  # no better schedule in the last trials (`tune.early_stopping`)
    SEARCH_EXHAUSTED = "search-exhausted"  # every candidate of the space measured: no budget grows it
    ALL_FAILED = "all-failed"  # every measurement of a round failed (a search-guard verdict, not a state)
