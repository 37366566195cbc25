"""Helpers the tests share: run and archive factories, model definitions importable by spawned workers, and the
browser harness. Test files import from here, never from one another."""
