"""A customer-ticket state and questions shared by the real-model suites."""

from openjev.core.types import ChoiceQuestion, NoulQuestion, Option, ScoreQuestion

TEXT = (
    "Hello, I ordered a blue jacket (order #{n}) three weeks ago. It still has not arrived, and yesterday my "
    "card was charged a second time for the same order. I want the duplicate charge refunded today, or I "
    "will dispute it with my bank. "
)
QUESTIONS = (
    ("refund", NoulQuestion("Does the customer ask for a refund?")),
    (
        "team",
        ChoiceQuestion(
            "Which team should handle this?",
            (
                Option("billing", "Payments, charges and refunds"),
                Option("shipping", "Delivery and tracking"),
                Option("tech", None),
            ),
        ),
    ),
    ("anger", ScoreQuestion("How frustrated is the customer?", ("Calm", "Annoyed", "Angry", "Furious"))),
)
