"""Checkers for the notebooks' exercises: run the student's code and say what is wrong in plain words."""
