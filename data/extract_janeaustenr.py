"""Re-creates data/pride_and_prejudice.txt from Debian's r-cran-janeaustenr.

Usage: apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
       python data/extract_janeaustenr.py pkg/usr/lib/R/site-library/janeaustenr/data OUT.txt

R's lazy-load database stores an index (.rdx, gzip) mapping object names to
(offset, length) in the .rdb file, where each object is a 4-byte length followed
by a zlib stream of R's serialization format; the `rdata` package parses that
format. This is a provenance tool, not part of zspeed (rdata is not a dependency).
"""
import gzip
import hashlib
import sys
import zlib
from pathlib import Path

import rdata
import rdata.parser as rparser


def main(data_dir: str, out: str, name: str = "prideprejudice") -> None:
    d = Path(data_dir)
    index = rdata.conversion.convert(rparser.parse_data(gzip.decompress((d / "Rdata.rdx").read_bytes())))
    rdb = (d / "Rdata.rdb").read_bytes()
    off, length = (int(x) for x in index["variables"][name])
    lines = rdata.conversion.convert(rparser.parse_data(zlib.decompress(rdb[off + 4:off + length])))
    text = "\n".join(str(s) for s in lines) + "\n"
    Path(out).write_text(text, encoding="utf-8")
    print(len(text), hashlib.sha256(text.encode()).hexdigest())


if __name__ == "__main__":
    main(*sys.argv[1:])
