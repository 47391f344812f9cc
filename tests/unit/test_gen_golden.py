"""Golden output: the pcap bytes and truth JSON of the generator must not change.

The hashes were computed with the code as of commit f1a6624 (before the speed work on the
model and the pcap writer), so any optimisation has to reproduce every output byte and
every truth value exactly.  Each case: (preset, seed, snaplen, frames, sha256 of the pcap
file, sha256 of the truth JSON as written by `write`).

ring-32 full frames (8.45 GB) is only checked with SKEWGEN_GOLDEN_BIG=1 (hashed while
writing to a temp dir, needs the disk space).
"""
import hashlib
import json
import os

import pytest
from test_gen_common import TMP

from skewscope import gen as skewgen

GOLDEN = [
    ("ring-healthy", 0, 0, 88704, "e68ab85d4bba566da117abb5c3d581601d92264d85f647e7a8ac4fb4417f878a",
     "a99b596e4c8fe0912e675901521bd6882a1db7709be06995ee719ab8c53992ca"),
    ("ring-healthy", 0, 128, 88704, "edadb9240e75dba3fa462159f0cb04eedb21e7536ef72be5eb45b18642cb4a97",
     "a99b596e4c8fe0912e675901521bd6882a1db7709be06995ee719ab8c53992ca"),
    ("ring-straggler", 0, 0, 88704, "f64c883c73e612fba6fb5118179961ce257a744bc87c22aae661a3de2b963798",
     "98348be7f139a1153dad46f88e96456284ba36309423d2f4600eaab14963497d"),
    ("ring-straggler", 0, 128, 88704, "db98a45260ead3914285632b68d481e675f4604c82eab85fa9accfe43e15469c",
     "98348be7f139a1153dad46f88e96456284ba36309423d2f4600eaab14963497d"),
    ("ring-ll128", 0, 0, 60784, "d1cb6a72579a2c94b627c6d2ff5a8f607ba7d86a50e4ab3cc3008b363ddd3973",
     "317a55c8ee5908da64eaacebf5fe75565b0b02b7e6a9f36dcf1f13b01ad0a81b"),
    ("ring-ll128", 0, 128, 60784, "e49e64abfa07e64dcbfac98b151cb296fb76553d3db678a91ea36adc50e8b255",
     "317a55c8ee5908da64eaacebf5fe75565b0b02b7e6a9f36dcf1f13b01ad0a81b"),
    ("tree-healthy", 0, 0, 29568, "03a4879065585da205ddb1e530201f295586067136d1622a9be32e10be24db0e",
     "cedfab618e8dc509aeb856f57b6fab6f36893b1a01e34b7976e8fe41448b0dc9"),
    ("tree-healthy", 0, 128, 29568, "acc4e749f0c06d652d0b55f5a749c2380c31cc0f6a26ea4835801bafcd8f7720",
     "cedfab618e8dc509aeb856f57b6fab6f36893b1a01e34b7976e8fe41448b0dc9"),
    ("alltoall-healthy", 0, 0, 12768, "51c8f7fb852879dafed258cf679bacb8931ef6c4f236fc6c4afad248f9fba788",
     "ecc86c4cbc4c7125187cf8ef159955d50d0b0cd041dabdf92756a9015ea7bd4d"),
    ("alltoall-healthy", 0, 128, 12768, "0eb69adfb97215d841c34a021373140f26f2978de0b95339d7559d8fcd68007d",
     "ecc86c4cbc4c7125187cf8ef159955d50d0b0cd041dabdf92756a9015ea7bd4d"),
    ("moe-hot-expert", 0, 0, 11704, "1ab59ce7c29b583b623253bc32908e254598a9ff266338074fd76c9a9021048b",
     "7befbdfa182554836663aad9321c49fdae291b68b00bdaaf30f3ca77a66ff419"),
    ("moe-hot-expert", 0, 128, 11704, "230f855f9d4997dce7cf9a30a8ef40e48c421e3fa466230fa0a84cfe15a8446c",
     "7befbdfa182554836663aad9321c49fdae291b68b00bdaaf30f3ca77a66ff419"),
    ("incast", 0, 0, 18368, "4d4502bcc6284eb52ee3aa5be2e77fd428bde8fc44d8769bd45ef30e7748251d",
     "16466151507e739ee01538d7694813851650f68a3761d7b5d797b2cf196ecb72"),
    ("incast", 0, 128, 18368, "c160309be62120b6c357f241428128e8c4328f854f33e8a27d3f5f3340abde61",
     "16466151507e739ee01538d7694813851650f68a3761d7b5d797b2cf196ecb72"),
    ("congestion", 0, 0, 13032, "74e3e7f82d3ad11380ddba273eddb58e2031682877a54fa7c6d36e7a528e500e",
     "5a73536b69711f64faa524d6682b184293a9dc2fe6afe6a4d0eff8b05bc6420e"),
    ("congestion", 0, 128, 13032, "783bdd56c679922026b42f0970f9f857e7f7ba1338b47054d5eb345e92193939",
     "5a73536b69711f64faa524d6682b184293a9dc2fe6afe6a4d0eff8b05bc6420e"),
    ("loss", 0, 0, 25211, "d337b1092f693a9328c0c0659d3526d4d93ef670a7bd3300d99056c7842b17b8",
     "e82d754e5ec85e42123516cef13bcd74f620b55b4c4079285b7f5e987d6f3e14"),
    ("loss", 0, 128, 25211, "d4b673c333c2eb0ef7cdb666d5b704acfa4c49b7d13993bf1bd75f324d0f98fa",
     "e82d754e5ec85e42123516cef13bcd74f620b55b4c4079285b7f5e987d6f3e14"),
    ("pfc", 0, 0, 59176, "e130d9461fde4e484a65ecdde8a7b82793eb55e4190e903e8108fcea20e39eaf",
     "e2b8eacf494b8014bfdab029817d462e5103a7cdcf3ccf37478ed2a361af34a7"),
    ("pfc", 0, 128, 59176, "923de1257dc8e1fad2e66cc9d3bd151bd9beddb7894377ae040f125a4a80b575",
     "e2b8eacf494b8014bfdab029817d462e5103a7cdcf3ccf37478ed2a361af34a7"),
    ("pipeline-bubbles", 0, 0, 20160, "161c5bb0175823ec1b7ff57c14294086baf3bcdfe6dd789afc3b1456addc82d7",
     "8239ca008a17c88b2f79f21109e58defed2233f7c7b626f99e9266d8d38324b8"),
    ("pipeline-bubbles", 0, 128, 20160, "58904186f62db723f48c05b05f28570ef3ac156c598ac8b77d2cff279b226daa",
     "8239ca008a17c88b2f79f21109e58defed2233f7c7b626f99e9266d8d38324b8"),
    ("pipeline-healthy", 0, 0, 20160, "6b279fbd766cb48074baf93e1c428fcfe584cd7480837739e696be800b89c6ce",
     "35b1f4ac96accd3eeffe12cad63a66745da1ea03a11ac347e62a428ba9fd60fd"),
    ("pipeline-healthy", 0, 128, 20160, "1fe06a1cfd41a06afb5405d36c2826cfd29d0a7c7baa15c8423a4f820e70472f",
     "35b1f4ac96accd3eeffe12cad63a66745da1ea03a11ac347e62a428ba9fd60fd"),
    ("slow-link", 0, 0, 30000, "d55b92a0925a3b2d02bf0a991f49d9be40760e8ff4de32186ecd48ac66d3fcad",
     "fb533fb1318f9fa3fe9a09a2b4cf5c7cb3ef90281d9739c662142596f7f2898d"),
    ("slow-link", 0, 128, 30000, "f83a28822cd561bf2c645faf8357ab94c01c6cca24fbaa39f4222347367d2f5f",
     "fb533fb1318f9fa3fe9a09a2b4cf5c7cb3ef90281d9739c662142596f7f2898d"),
    ("flapping-link", 0, 0, 6356, "06ac16c8b258ce9a52009ff6c0602f2429d5b647621d31a1681ce731d54d90a3",
     "4ead315a1cd4dd09520dbd5e254e9f55428c05e8fc18ca9806beebff1552e667"),
    ("flapping-link", 0, 128, 6356, "df9dbb663cb43d0944fd88912d2af23e83af9c22fec964c5f91920b54222fe94",
     "4ead315a1cd4dd09520dbd5e254e9f55428c05e8fc18ca9806beebff1552e667"),
    ("tp-decode", 0, 0, 23040, "30b93477c4b7671126c038d4bcabeb2d4e25aec39a870e7414af2d9a9cce1ac1",
     "33a113533d8a3c642650954ccb6e2c701e870d646e8821ecbc885055a99bf80d"),
    ("tp-decode", 0, 128, 23040, "59d4310018771519cc87e597b7a30fe759464c6308e86bdbbfab793fe691a436",
     "33a113533d8a3c642650954ccb6e2c701e870d646e8821ecbc885055a99bf80d"),
    ("tp-decode-prefill", 0, 0, 57600, "87eb1523bb5fd5dfa20e2aae97b497cd4e5c327802376a7f617d8a6459ef546f",
     "9ceb2f52a86afe2771f67809060d89307bb47d1874480ac2a07c226a316daedf"),
    ("tp-decode-prefill", 0, 128, 57600, "4dbc34c9b5fdc8433ddf4b0f67e6863a006488a9899726995ec7c4c0d1440b91",
     "9ceb2f52a86afe2771f67809060d89307bb47d1874480ac2a07c226a316daedf"),
    ("moe-decode", 0, 0, 8934, "9e9986b847a51ac64daa0aeed5facbe98c06d837f9de022ef0426e57fca0f6ea",
     "e9a6562e2a2739db6ef5013fc42860ba7a296e59b8d9c66cadc709738ed5e383"),
    ("moe-decode", 0, 128, 8934, "e69517f307b12a9041d127c317eb7a5a1808faa63c650c9974aaa16edcf21991",
     "e9a6562e2a2739db6ef5013fc42860ba7a296e59b8d9c66cadc709738ed5e383"),
    ("ipv6-ring", 0, 0, 50112, "05bbcc7bb83d343f1c2c85cfea9e6da37aa3d7f605c8160f4eab4b76bb7dbe1d",
     "fd47a752143dcda4632ea9eaad21fd780ea03fb4c84ef857e0f12b9dcee4e947"),
    ("ipv6-ring", 0, 128, 50112, "4e8625b78fd4412dd4b6d71a2ff0fd9c365eb6866287729543e7270b7b207a48",
     "fd47a752143dcda4632ea9eaad21fd780ea03fb4c84ef857e0f12b9dcee4e947"),
    ("vlan-alltoall", 0, 0, 8512, "7f14f3324a9ac3e78b0b1cb80d766e9648d353d9f78c2f75b48248a4438ded4a",
     "8677696fbb597340ea6349c9312872a2b4d67be16ccb338e58e47e6c03bfcd3f"),
    ("vlan-alltoall", 0, 128, 8512, "35187a66f11a6dfc40557fe506bd35202bec66aadddba81439c72b0ae1c8ec62",
     "8677696fbb597340ea6349c9312872a2b4d67be16ccb338e58e47e6c03bfcd3f"),
    ("demo-mix", 0, 0, 51918, "5764313c114e3a59975acaf942c1f611c97e3e013c00b2e6b06269f619fad85d",
     "6878d003840e4210bbcf84be8ed476f999a6950855604801a8782c9fcd63ddb3"),
    ("demo-mix", 0, 128, 51918, "57274b09373bea97152670a9ca605edd8c4eb007224cf0b7e0585945166cd2fc",
     "6878d003840e4210bbcf84be8ed476f999a6950855604801a8782c9fcd63ddb3"),
    ("mixed", 0, 0, 17486, "d3f2aa5c60c12f3fde78d97462bb50b378eb2c46c6eaef0f002447289108bf5e",
     "64eb60d4f68bc763f838e36aa7ba3fe5e4b7b029d1b2af84ccd1dd69cf65768f"),
    ("mixed", 0, 128, 17486, "446bc09e55c6b7b21fe384e9d01772ca52593471cc1248fe10824c9fb95562f9",
     "64eb60d4f68bc763f838e36aa7ba3fe5e4b7b029d1b2af84ccd1dd69cf65768f"),
    ("loss", 1, 0, 25224, "52ce5024ccda0d60bbfecb9f9caf3d86db7ae5562b4bdaceae6ff7dc698447e6",
     "e21dbcf9b8709a2a307d99258c24e46fab19f29264673e8f174e2d7dd4de85eb"),
    ("loss", 7, 0, 25224, "a5ba60a80c362a7f084ddbe087c9bae4990a8cbf51be3b2ec851f6cbd9459826",
     "798d41386da435102f9e6fa02aeab32d7b2013d5681719882f6e0d7814e8e4cc"),
    ("mixed", 1, 0, 17476, "a348a7658028be7bad88d5fb01c7854799b43b854af87f529139e9917595d842",
     "f5a6fb9608811a8e9a5c28b3792ca31b883009d6b7029991235c1bcc4119c702"),
    ("mixed", 7, 0, 17497, "589cf0052050338d7a2366cd9d0f5cf22c5c33b2691a779832173b1aa9fa20c0",
     "1d27e77dc30b00ef5ed7dae1505b0c76cc338ecd3f3dac242dd29f4d4f65fa35"),
    ("congestion", 1, 0, 13024, "464e3845043071b33b8f4a27f5f04b660fc2fa1e4156fcf0ddc9d9f4df862435",
     "b11cafe027531dbe2aeb6d027e133921ec5c700a927e6054e4149e3b6cb257c0"),
    ("congestion", 7, 0, 13022, "1144fec78d285a4e3c6b1697821debc21e0e374f7d60f47370a3f3e72faabdfc",
     "afeaa0cc06cef9f1d5f69827d97a58753d9eae428217706c8e92b8a8fd7b2db9"),
    ("ipv6-ring", 1, 0, 50112, "c8a63f9a0fbe964c9cf42cf45f86edae119aa3bed768f0d4b9ae674db0c6a698",
     "40d373a413a0a5a18e083e53c51cb7f0e6d65ab0c7c73d63d7014f8030c56df1"),
    ("ipv6-ring", 7, 0, 50112, "62aa34cb069c0087966f2921839f230879fd1311c5591963ad432551517fc1a4",
     "fe72e9b1150f5cb4f265633838cb73dfb0137780f838ea77c8f4da90fb273421"),
    ("vlan-alltoall", 1, 0, 8512, "5d0d6af036a39d1867afe25d7c8e74a6e4047ba1a49fc9d4033c76deb6dee48f",
     "9f2b192c4651d9da9b2a8e88e56fbae31573083d1c418bd3354ed7b787a208f3"),
    ("vlan-alltoall", 7, 0, 8512, "3e0e117564c7a88ff6459f4b79e0ead9f724526955a043ec34b4dc8015443174",
     "6e5e7ddb4b8a3026969a126963c8376f28017c7f85874927fa85b69d377716d0"),
    ("flapping-link", 1, 0, 6356, "560a60ae9f0421d9fca77ad0490a6ea014f549b2c001ee7094835e9e3209ea9a",
     "8c8fc6218c1aae70daa89f5a7101581ded7368a662df570c491f2299a953d17b"),
    ("flapping-link", 7, 0, 6356, "b38a63db27acbf3bac0ad51f031ebdb609800dff357495bf7ef39c4a506f71f9",
     "4194160afca029158acf1a7d8f0b3bbc5ca8c4309b31bcb2d55216c85f0b61fe"),
    ("demo-mix", 1, 0, 51919, "082fccdb9d8755d7f92ffc9541cc0579307e59311220d46c852fc70e1e2eefd3",
     "565a543967ff0352edfe8c832b040dacfca5c2b37690d19ed61f75a94eae13f8"),
    ("demo-mix", 7, 0, 51915, "5eef8af11260d053918fa6ee36cc190741b75a985825aa6f507685dabb03e97d",
     "7360d2b9cb7b74090975de7e88d9e075f61ac5cbca5093466b91da657e806b13"),
    ("tp-decode-prefill", 1, 0, 57600, "ce609afe1c7462f6ff960e75cd5d1d02fecc0676f3f25c20853392d2c155c26e",
     "3c37e47898a4b9454ce3c3d83c92cce10352428c4f49229a26cf7d4a108ac85a"),
    ("tp-decode-prefill", 7, 0, 57600, "169c150115e9a811591eff932e365ce9d497396b09bc6428cd95daeca3fa30c1",
     "062b464b7fe590be31884a95ad511c81522e2b205f437bccf9aed511b4e8ad39"),
    ("ring-32", 0, 128, 2126848, "6917254158dca6cb77105d33081b24bd15b7bb44e8487133bfa122cf1eb627c1",
     "91560b5f0345030b7b686b6128a8c34c170ae870adc55fbc8dde20004a4e7368"),
    ("ring-32", 3, 128, 2126848, "d242d56fc8e192b4c0403515b55d53999d46b2776f1470b6e69540db4862c9b6",
     "1fd9944d189ae832cd440b68a73a7d5e816ddedc1a261722a3531554c9c67a14"),
]
RING32_FULL = ("ring-32", 0, 0, 2126848,
               "35fcb88d18287956dca46b397d26175bc1aedd00990936bab2376fc049b91241",
               "91560b5f0345030b7b686b6128a8c34c170ae870adc55fbc8dde20004a4e7368")


def _sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 24)
            if not b:
                return h.hexdigest()
            h.update(b)


def _check(name, seed, snaplen, frames, pcap_sha, truth_sha):
    path = os.path.join(TMP, f"golden-{name}-{seed}-{snaplen}.pcap")
    try:
        cap = skewgen.write(name, path, seed=seed, snaplen=snaplen)
        assert len(cap) == frames
        assert _sha_file(path) == pcap_sha, f"{name} seed {seed} snaplen {snaplen}: pcap bytes changed"
        tpath = skewgen.truth_path(path)
        assert _sha_file(tpath) == truth_sha, f"{name} seed {seed}: truth changed"
        text = json.dumps(cap.truth, indent=1) + "\n"
        assert hashlib.sha256(text.encode()).hexdigest() == truth_sha
    finally:
        for p in (path, skewgen.truth_path(path)):
            if os.path.exists(p):
                os.unlink(p)


@pytest.mark.parametrize("name,seed,snaplen,frames,pcap_sha,truth_sha", GOLDEN,
                         ids=[f"{g[0]}-s{g[1]}-snap{g[2]}" for g in GOLDEN])
def test_output_identical_to_before(name, seed, snaplen, frames, pcap_sha, truth_sha):
    _check(name, seed, snaplen, frames, pcap_sha, truth_sha)


@pytest.mark.skipif(not os.environ.get("SKEWGEN_GOLDEN_BIG"),
                    reason="8.45 GB pcap: set SKEWGEN_GOLDEN_BIG=1")
def test_ring32_full_frames_identical_to_before():
    _check(*RING32_FULL)
