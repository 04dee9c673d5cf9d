"""`python -m classifier train | eval | predict` (the same as `slotgate classifier ...`)."""

import sys

from classifier.cli import classifier_main

sys.exit(classifier_main(sys.argv[1:]))
