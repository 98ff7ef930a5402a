"""Fine-tuning heads, GLUE tasks and metrics, the fine-tuning loop and the GLUE sweep."""
