"""The training input: records -> fixed-shape NumPy batches on every host.

- ``tf_data``: ``make_pretrain_iterator(records, PipelineSettings)``, per-host tf.data with an
  exactly resumable position (``get_state`` / ``set_state``).
- ``input_shards``: the global batch from a fixed number of disjoint readers, whatever the
  host count.
- ``packing``: several short instances in one row, losses unchanged.
"""
