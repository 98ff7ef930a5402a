"""Prepared records on disk.

- ``tfrecord``: the original google-research/bert TFRecord features (serialize, write, parse, read).
- ``integrity``: damaged TFRecord files found and named, or skipped and counted.
- ``manifest``: what ``data prepare`` made a directory from (inputs by content, settings) and
  whether it finished (completion marks).
"""
