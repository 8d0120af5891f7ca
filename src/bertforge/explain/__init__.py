"""Explaining predictions: attributions to the user's words (explain), and the page that shows them."""

from bertforge.explain.attribute import explain
from bertforge.explain.methods import METHODS
from bertforge.explain.result import Explanation, TokenAttribution, WordAttribution
from bertforge.explain.targets import TARGET_BUILDERS

__all__ = ["METHODS", "TARGET_BUILDERS", "Explanation", "TokenAttribution", "WordAttribution", "explain"]
