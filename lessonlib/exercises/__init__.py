"""Checkers for the notebooks' exercises: run the student's code and say what is wrong in plain words.

Lesson 05's second design question (a layout over five axes) is in ``frontier``, which
``hybrid`` re-exports so that the notebook's ``ex`` reaches it."""
