"""Erasing a person: see ``erase.py`` (the use case) and docs/how-to/erase-a-person.md."""

from .erase import ErasureOutcome, erase_person
from .subject import KINDS, Subject, subject_of

__all__ = ["KINDS", "ErasureOutcome", "Subject", "erase_person", "subject_of"]
