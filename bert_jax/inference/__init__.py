"""Using a trained model: features (`encode`), masked tokens (`fill_mask`) and, for a fine-tuned
model, its task's predictions (`predict`). Each module is one command's library side."""
