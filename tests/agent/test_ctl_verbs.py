"""llmgw's command line is built from its groups of verbs (agentd/ctl/): a verb declared
in a group but missing from ``HELP_ORDER`` would not exist, and two groups declaring
the same verb would leave one unreachable."""

from agentd import ctl


def test_every_verb_of_every_group_is_on_the_command_line_once():
    names = [name for group in ctl.GROUPS for name in group.VERBS]
    assert len(names) == len(set(names)), "two groups declare the same verb"
    assert sorted(ctl.HELP_ORDER) == sorted(names)
