"""The paper's pretraining experiments (Devlin et al., 2018), each a few settings over the paper's
recipe (`bert:base`, `bert:large`), named `--config paper/NAME[:ROW]`:

table5_no_nsp.py  Table 5 "No NSP": the masked LM alone (objective mlm)
table5_ltr.py     Table 5 "LTR & No NSP": a left-to-right LM (objective ltr)
table6.py         Table 6's model sizes, one row each (`paper/table6:L6_H768_A3`)
table8.py         Table 8's MASK/SAME/RND mixes, one row each (`paper/table8:80_0_20`)
"""
