"""The models fine-tuning puts on top of BERT, and their losses.

- `pooled`: heads on the pooled [CLS]: classification, regression, multiple choice.
- `per_token`: a dense head at every token (SQuAD's spans, CoNLL-2003's tags).
- `lstm_tagger`: frozen BERT layers (six variants) into a two-layer BiLSTM tagger (Table 7).
"""
