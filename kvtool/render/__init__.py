"""Renderers: turn library results into tables, JSON, CSV or JSON lines on a given stream."""
