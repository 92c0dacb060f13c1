"""``Filter``: keep or drop a message by its tag and/or a safe expression over its JSON body.

Config ``filter: {tags: [...], exclude_tags: [...], expression: "..."}``; a message is kept when it
passes every condition given. A dropped message is finished at once (its offset may be committed and
its key's successor runs), counted as ``filtered_out``. The expression language is in
:mod:`ddmq.config.expression`: comparisons over JSONPaths, ``and``/``or``/``not``; nothing runs as
code. In a body that is not JSON every path finds nothing.
"""

from __future__ import annotations

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import INVALID_JSON, NOT_PARSED, Job
from ddmq.config.expression import compile_expression
from ddmq.config.jsonpath import MISSING


@register("Filter")
class FilterAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx
        config = ctx.config.filter
        assert config is not None  # the config refuses Filter without its settings
        self._keep_tags = frozenset(config.tags)
        self._drop_tags = frozenset(config.exclude_tags)
        self._expression = compile_expression(config.expression) if config.expression else None

    def keeps(self, job: Job) -> bool:
        tag = job.message.tag
        if self._keep_tags and tag not in self._keep_tags:
            return False
        if tag in self._drop_tags:
            return False
        if self._expression is not None:
            data = job.data
            if data is INVALID_JSON or data is NOT_PARSED:
                data = MISSING
            return self._expression(data)
        return True

    def act(self, job: Job) -> Status:
        if self.keeps(job):
            return Status.CONTINUE
        self._ctx.count("filtered_out")
        return Status.FINISH
