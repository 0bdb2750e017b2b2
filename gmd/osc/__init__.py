"""``openstack fairness …``: gmd's read API through the openstack command line (a
python-openstackclient plugin), with the cloud's own authentication (clouds.yaml, ``OS_*``)
and output formats (``-f json``, ``-c``). Runs wherever people run ``openstack``: it needs
none of gmd's own libraries, only the read API's JSON."""
