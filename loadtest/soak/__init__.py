"""``python -m loadtest.soak``: a chaos soak of a whole Ferry stack (see ``__main__``)."""
