"""The rope types: what a method declares (``declare``), the table every part reads (``registry``), transformers'
own types as the package validates them (``builtin``), and building ``rope_parameters`` for a model
(``rope_parameters``). Method modules (``frequencies``, ``attention.methods``) register themselves into the table;
this package imports none of them."""
