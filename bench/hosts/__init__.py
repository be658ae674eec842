"""Several hosts on one machine, with real links: ``python -m bench.hosts`` (see ``__main__``).

``bench.hosts.netns.Hosts`` makes them (network namespaces, veth pairs, a bridge, a rate and
a delay per link) for this command and for the tests (``tests/helpers/hosts.py``);
``python -m bench.hosts.cost`` measures what a link costs a group of learners (see ``cost``)."""
