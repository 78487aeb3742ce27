"""test_pool_template.py -- warm shells of a template that has since been rebuilt are not handed out:
a create after the rebuild gets the new image, and the pool refills with it."""

import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402


class PoolTemplateTest(unittest.TestCase):
    def test_rebuilt_template_replaces_warm_shells(self):
        moatd.ensure_template("base")
        moatd.ensure_template("code-interpreter")
        shared = moatd.TEMPLATE_DIR
        tdir = tempfile.mkdtemp(prefix="moat-pool-tpl-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, tdir, True)
        # a template dir of the test's own whose base is the shared base's image (the recipe's
        # ready verdict copied), then "rebuilt" as a template dir whose image has numpy
        def install(name, image):
            d = os.path.join(tdir, name + ".new")
            os.makedirs(d)
            os.symlink(os.path.join(shared, image, "rootfs"), os.path.join(d, "rootfs"))
            for f in ("ready", "size"):
                shutil.copy(os.path.join(shared, "base", f), os.path.join(d, f))
            old = os.path.join(tdir, name)
            if os.path.exists(old):
                os.rename(old, old + ".old")
            os.rename(d, old)
        install("base", "base")
        d = moatd.MoatDaemon(pool=2, template_dir=tdir)
        self.addCleanup(d.stop)
        d.start()
        c = d.client
        numpy = "python3 -c 'import numpy' 2>/dev/null && echo new || echo old"
        time.sleep(3)  # the pool fills
        sid = c.create()["id"]
        self.assertEqual(c.sh(sid, numpy).strip(), "old")
        time.sleep(2)  # the pool refills
        install("base", "code-interpreter")
        for i in range(3):
            sid = c.create()["id"]
            self.assertEqual(c.sh(sid, numpy).strip(), "new", "create %d after the rebuild got a warm shell of the "
                                                             "replaced image" % i)


if __name__ == "__main__":
    unittest.main()
