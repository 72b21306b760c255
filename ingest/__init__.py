"""Turning outside material (snapshot dirs, Teacher streams) into events, and the event log."""
