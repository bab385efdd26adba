"""How the QA benchmark asks and grades: one answer prompt for every system, each benchmark's judge, and LoCoMo's
token F1 and exact match.

* The answer prompt is the same for tkg and the baselines; only the context differs. It gives the question's date,
  as the Zep paper's context template does, so that relative questions ("how many days ago") can be answered.
* LongMemEval's judge prompts are the benchmark's own, per question type and for abstention questions, as
  published with the dataset (``src/evaluation/evaluate_qa.py`` of github.com/xiaowu0162/LongMemEval, MIT
  licence, Copyright (c) 2024 Di Wu): they are the protocol, so they are reproduced word for word; the label is
  "yes" in the judge's reply, as there.
* LoCoMo's LLM-as-judge follows the protocol the Mem0 paper describes (a judge model labels each answer CORRECT or
  WRONG against the gold answer, generous about wording and date formats, and the score is the share labelled
  CORRECT); the prompt text is this project's own. F1 and exact match are the LoCoMo paper's token metrics
  (answers lower-cased, punctuation and articles removed).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from datetime import datetime

__all__ = ["answer_prompt", "exact_match", "judge_prompt", "judged_correct", "token_f1"]

ANSWER_PROMPT = """You answer questions about a user's past conversations, using only the memory below.

# Memory
{context}

# Today's date
{today}

# Question
{question}

Answer in a short phrase or sentence. Use the dates in the memory for questions about time. If the memory does not
hold the answer, say that you do not know."""


def answer_prompt(context: str, question: str, asked_at: datetime) -> str:
    return ANSWER_PROMPT.format(
        context=context or "(nothing)", today=f"{asked_at:%Y-%m-%d (%A) %H:%M}", question=question
    )


# -- LongMemEval's judge (the benchmark's own prompts, see the module docstring) ---------------------------------

_LME_INTRO = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes if the response "
    "contains the correct answer. Otherwise, answer no. If the response is equivalent to the correct answer or "
    "contains all the intermediate steps to get the correct answer, you should also answer yes. If the response "
    "only contains a subset of the information required by the answer, answer no."
)
_LME_TAIL = (
    "\n\nQuestion: {}\n\nCorrect Answer: {}\n\nModel Response: {}\n\nIs the model response correct? "
    "Answer yes or no only."
)
LONGMEMEVAL_JUDGE = {
    "single-session-user": _LME_INTRO + " " + _LME_TAIL,
    "single-session-assistant": _LME_INTRO + " " + _LME_TAIL,
    "multi-session": _LME_INTRO + " " + _LME_TAIL,
    "temporal-reasoning": _LME_INTRO
    + " In addition, do not penalize off-by-one errors for the number of days. If the question asks for the number "
    "of days/weeks/months, etc., and the model makes off-by-one errors (e.g., predicting 19 days when the answer is "
    "18), the model's response is still correct. " + _LME_TAIL,
    "knowledge-update": (
        "I will give you a question, a correct answer, and a response from a model. Please answer yes if the response "
        "contains the correct answer. Otherwise, answer no. If the response contains some previous information along "
        "with an updated answer, the response should be considered as correct as long as the updated answer is the "
        "required answer."
    )
    + _LME_TAIL,
    "single-session-preference": (
        "I will give you a question, a rubric for desired personalized response, and a response from a model. Please "
        "answer yes if the response satisfies the desired response. Otherwise, answer no. The model does not need to "
        "reflect all the points in the rubric. The response is correct as long as it recalls and utilizes the user's "
        "personal information correctly.\n\nQuestion: {}\n\nRubric: {}\n\nModel Response: {}\n\nIs the model response "
        "correct? Answer yes or no only."
    ),
}
LONGMEMEVAL_ABSTENTION = (
    "I will give you an unanswerable question, an explanation, and a response from a model. Please answer yes if the "
    "model correctly identifies the question as unanswerable. The model could say that the information is "
    "incomplete, or some other information is given but the asked information is not.\n\nQuestion: {}\n\n"
    "Explanation: {}\n\nModel Response: {}\n\nDoes the model correctly identify the question as unanswerable? "
    "Answer yes or no only."
)

# -- LoCoMo's judge (this project's wording of the protocol in the Mem0 paper) -----------------------------------

LOCOMO_JUDGE = """Grade an answer to a question about a conversation. Compare the generated answer with the gold
answer and label it CORRECT or WRONG.

Be generous: the generated answer is CORRECT when it states the same fact as the gold answer, even if it is longer,
worded differently, or gives a date in another format (for time questions the date, month or year must match what
the gold answer says). It is WRONG when it contradicts the gold answer, misses its point, or says it does not know.

Question: {question}
Gold answer: {gold}
Generated answer: {answer}

Reply with one word: CORRECT or WRONG."""

LOCOMO_ABSTENTION = """Grade an answer to a question that the conversation cannot answer (its premise is false).
The answer is CORRECT when it says the information is not available, or rejects the premise; it is WRONG when it
answers as if the premise were true.

Question: {question}
Why it cannot be answered: {gold}
Generated answer: {answer}

Reply with one word: CORRECT or WRONG."""


def judge_prompt(dataset: str, kind: str, question: str, gold: str, answer: str, abstention: bool) -> str:
    if dataset.startswith("longmemeval"):
        template = LONGMEMEVAL_ABSTENTION if abstention else LONGMEMEVAL_JUDGE[kind]
        return template.format(question, gold, answer)
    template = LOCOMO_ABSTENTION if abstention else LOCOMO_JUDGE
    return template.format(question=question, gold=gold, answer=answer)


def judged_correct(dataset: str, reply: str) -> bool:
    """The judge's label: LongMemEval counts "yes" anywhere in the reply (as its script does); LoCoMo's judge
    answers CORRECT or WRONG."""
    text = reply.strip().lower()
    if dataset.startswith("longmemeval"):
        return "yes" in text
    return "correct" in text and "wrong" not in text and "incorrect" not in text


# -- LoCoMo's token metrics --------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")


def _normalise(text: str) -> list[str]:
    text = text.lower().replace(",", "")
    text = "".join(c for c in text if c not in string.punctuation)
    return _ARTICLES.sub(" ", text).split()


def token_f1(prediction: str, gold: str) -> float:
    predicted, wanted = _normalise(prediction), _normalise(gold)
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if not predicted or not wanted or common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> bool:
    return _normalise(prediction) == _normalise(gold)
