"""bertforge: BERT, complete and readable."""
