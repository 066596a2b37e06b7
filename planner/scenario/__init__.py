"""The scenario: its schema, loading (located errors), checks, edits, router-card values and
pricing."""
