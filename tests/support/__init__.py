"""Test helpers shared by the test folders (import as `support.<module>`)."""
