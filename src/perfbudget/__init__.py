"""perfbudget: performance budgets for PyTorch models, checked by pytest."""
