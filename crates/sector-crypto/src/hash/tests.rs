//! Known answers per hash: digest, HMAC (short and over-long key), PBKDF2-HMAC over two
//! output blocks and over 1000 iterations.
//!
//! Sources: OpenSSL 3.0 (Python's `hashlib`/`hmac`, `openssl kdf` with the legacy provider
//! for whirlpool and md4) and CPython's reference BLAKE2 at the libgcrypt-only digest
//! lengths, all computed outside this crate; the Streebog-512 PBKDF2 vectors are published
//! in R 50.1.111-2016; SHA-1/SHA-256/SHA-512 PBKDF2 vectors (RFC 6070, RFC 7914) are in
//! `kdf.rs`.

use super::*;

/// (name, H("abc"), HMAC("key", "The quick brown fox jumps over the lazy dog"),
///  HMAC("k" × 200, "msg"), PBKDF2("password", "salt", 2, output_len + 5),
///  PBKDF2("passwordPASSWORDpassword", "saltSALTsaltSALTsaltSALTsaltSALTsalt", 1000, 32)).
const VECTORS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("sha224", "23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7", "88ff8b54675d39b8f72322e65ff945c52d96379988ada25639747e69", "2c5cc29e6df0855d603751dbaf428c53b2d39b8c4326cacd75d9a2fc", "93200ffa96c5776d38fa10abdf8f5bfc0054b9718513df472d2331d2d1e66a3f97", "e93bc0d03e4b30aa4a6d6972ff4a7c084e16346fb58923b18756b381e044da5c"),
    ("sha384", "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed8086072ba1e7cc2358baeca134c825a7", "d7f4727e2c0b39ae0f1e40cc96f60242d5b7801841cea6fc592c5d3e1ae50700582a96cf35e1e554995fe4e03381c237", "0cb4250af6e4eb116d8f2886e41bdecadf9bc53a778ea2344e1e63dc6221bdf57bb4b975d260f522822d8c7c3198cc5b", "54f775c6d790f21930459162fc535dbf04a939185127016a04176a0730c6f1f4fb48832ad1261baadd2cedd50814b1c806ad1bbf43", "4ead12bc0677849d57ea9343ad48f11865f6737d8338b0aa63ace945d3719b4d"),
    ("sha512-224", "4634270f707b6a54daae7530460842e20e37ed265ceee9a43e8924aa", "a1afb4f708cb63570639195121785ada3dc615989cc3c73f38e306a3", "a7291bdfa3fbff89e648e787368c9f685ce8cfe6c94ec75dbb11b06a", "b8878ac5e4509c165c1b508961fa3c3afcef3f37b7b081874e718d8daea670147a", "29a1778bd72edd4b7ec7d92728cd8a77d23f5b025a2c4c06c51408c5f1b8ed61"),
    ("sha512-256", "53048e2681941ef99b2e29b76b4c7dabe4c2d0c634fc6d46e0e2f13107e7af23", "7fb65e03577da9151a1016e9c2e514d4d48842857f13927f348588173dca6d89", "d87a5efd487b7a466829415c813e3cf1523feadec313246c0d6bea2b6f51f597", "fcfd108c99cc888ec0af9f184885aff5f02d19a956afad9ccea4d56a482b851bec1af5635d", "daa7f41afa569aea39e95f03b1bc2c6efb99fc7871e5ffed469209c822d0abe6"),
    ("sha3-224", "e642824c3f8cf24ad09234ee7d3c766fc9a3a5168d0c94ad73b46fdf", "ff6fa8447ce10fb1efdccfe62caf8b640fe46c4fb1007912bf85100f", "d8abea792e69783a3ad35cebffd429210e03c3fce1e0da8f84b7033b", "7979d7e05025f5b056e995939694ad55c644f43f1f748895c4ca881177e246578e", "2a8b612e27177b0c85cda3ce94c1cf3ef2be4f37457c309df2e357b1b4d2ce9d"),
    ("sha3-256", "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532", "8c6e0683409427f8931711b10ca92a506eb1fafa48fadd66d76126f47ac2c333", "4beeb04d637f2720b7472094d5aec0e1a6d78e52b0e4efc9870196be1593f4f2", "4c915baedd1773383e77fcfe38114ca7514010adec24b47290ec170208423f76f876ee35e7", "2e4d28ba88c7ff0710e56d9c4df15cab9661809273c2fcc447c5d86b6379d624"),
    ("sha3-384", "ec01498288516fc926459f58e2c6ad8df9b473cb0fc08c2596da7cf0e49be4b298d88cea927ac7f539f1edf228376d25", "aa739ad9fcdf9be4a04f06680ade7a1bd1e01a0af64accb04366234cf9f6934a0f8589772f857681fcde8acc256091a2", "335717ae2e35d6478b00d92e9041ec106fd7c6852ff688967826019d45f15bbc82293b5a12cd6404e16ae5de0742dad5", "0a163df94a9e97f05fb5bf609c4b02854299dc46099e115fad31c00656b317b88e1029d68aef38d974c521f933553781093b9411f6", "74fa3dca6d1eb6eb6aea3e9fa14f192f4f8f89c56ac3d6575ca5d4f95b172dcc"),
    ("sha3-512", "b751850b1a57168a5693cd924b6b096e08f621827444f70d884f5d0240d2712e10e116e9192af3c91a7ec57647e3934057340b4cf408d5a56592f8274eec53f0", "237a35049c40b3ef5ddd960b3dc893d8284953b9a4756611b1b61bffcf53edd979f93547db714b06ef0a692062c609b70208ab8d4a280ceee40ed8100f293063", "d51bc7b20e47765dcf05c50adaf322d5464c1dcb0a4b41c0593fe169e402f2c9a6fd6ce1bd01866cc7e7b8cecd57005e1cf1dc08cb07b61094fd09ae0729f318", "d6824ab17801706ad465f3196eb80dde20378696ab1fd6c68345c35825657a76954a1b24c7bc6589def0fe3eafae8b657c590bf0f065620b32d4d5450c8d2ee13c9ab7f64a", "ebe29697d6659a666b9153ff38627c7dd07f1ca388042e675b15b50e8ace5f57"),
    ("ripemd160", "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc", "50278a77d4d7670561ab72e867383aef6ce50b3e", "8ae13d7b8c7db6dc5d34c3065cb1338474c8eced", "768dcc27b7bfdef794a1ff9d935090fcf598555e66913180b9", "372598a48cd8bd557d72890d757cd16727d93d83532fdf61ad2e83814706a388"),
    ("whirlpool", "4e2448a4c6f486bb16b6562c73b4020bf3043e3a731bce721ae1b303d97e6d4c7181eebdb6c57e277d0e34957114cbd6c797fc9d95d8b582d225292076d4eef5", "7f7192e3a155cb6a8171584ba146882f26821658112dfd2601272db013517a31e573637d146584596f86a884eb0decc9514dde000ecf2476dc5d436a92197527", "2ee02d0b3bfbcbefc949fd79ce56d376273f117da3de0b01b7fa80a0e1725700ce0a80e6b35fd1466bb9df7737b0a7845888da706b335a3b0bd50338ca47935c", "110b2e4266f03c334f6085bf421a68d6976a2f767e0bb6041a9c9315ec0d249fc8cb5fac1f9f3b87dbb98e9b4b220dfe0d6b55f88109dd558c30f0a0356f7d9fdb61caa5c9", "a1b680fe0d5b9e48d54dd28267d65d02588573ea85e0477810fad28f8bb87834"),
    ("sm3", "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0", "bd4a34077888162b210645b8ebf74b9af357303789357a27c7fc457244ebd398", "73de3f3706e675f7d8bef124f194946b39e893db40a0e368470ed29d9ab52cc5", "fee723a2bc966e11dffb66133f4e8df577383c78ade30e3298edbd3e54ed85b7650006f9e1", "505b53520344c90b4e30f10655014b171e9b291d0fd657d9be43839dc8a59211"),
    ("md5", "900150983cd24fb0d6963f7d28e17f72", "80070713463e7749b90c2dc24911e275", "d318fd033415c0f938b087d5645e0045", "042407b552be345ad6eee2cf2f7ed01dd9662d8f0c", "0c30e826a5c1ad8e29d558bf48f32b800262a29cfa15ec631f12a18dd5993d1f"),
    ("md4", "a448017aaf21d8525fc10ae87aa6729d", "8d3366c440a9c65124ab0b5f4ca27338", "41a609ec3938eb0ace24fedcb77e7c25", "772c04936c276847314479e43a575a386a672cbe3d", "42497e2aa33659821e491ced7d0cca5fe76228a46f1e42e13b7eb055e70615e9"),
    ("blake2b512", "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923", "92294f92c0dfb9b00ec9ae8bd94d7e7d8a036b885a499f149dfe2fd2199394aaaf6b8894a1730cccb2cd050f9bcf5062a38b51b0dab33207f8ef35ae2c9df51b", "98de2352941a17672c6e5b8cb66ea726051e57b595399111f3a2baf3cb29ce1a78de179931c4d66f03fe4738c74bd6bd8d9ea717de572c6afd2cfa43f936eb82", "40b77cc2ee4b4c44eeb5babc299be14af5670e39ea3ce14c0fe70e6c99369886ab4d693bad8bd811ed64c5cf65a4cc5260993e17bbf2423c77164752fcbf5a60f4eccaa53b", "50a416b7c6e172e95609e398f798bc952088f96b637d8cc1c32a6354776d896c"),
    ("blake2s256", "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982", "f93215bb90d4af4c3061cd932fb169fb8bb8a91d0b4022baea1271e1323cd9a0", "156efbc76a887f37f943e93ae54e5498a34694ef0552923cff9825a1aff31835", "7b88e65e6e95a118bc995f681a391cbd7b46e0cf9750a81100f613add62d84be7f88c3e290", "bea902883ae7b13b6ca01ef498a4050c6324a8c30e6a658d2c72448e557cf257"),
    ("blake2b-160", "384264f676f39536840523f284921cdc68b6846b", "98af676e70aac5c26243aaaf06bcb8b8daa2bebd", "6bfaacbd0c9182581423c5ca72feb38641b695aa", "39c66fb0811c6b832623fbdda5e8e4b2ac01a67e2731851d6b", "aa7887c33c1ee8013765759e6cb1d3ef2facd3fe7140ab264eadc99ebabfcf73"),
    ("blake2b-256", "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319", "bb3e1cd6f38b5df1cb87983ec29d6116587c1b9bf6e5cd167ac7f2bc741d3817", "ca79d0563ec0f81509809697b093a745afbeb3d207cf99a14692de81743041a9", "9d630dc2d5d64832875dca5a34d702f966c22e72817135b85dafc75b4f6d175c509c61e6fe", "36119d3855f1d5a91c80b97f6adefc0e1df7e5575fd2d49caf653eb6093a5289"),
    ("blake2b-384", "6f56a82c8e7ef526dfe182eb5212f7db9df1317e57815dbda46083fc30f54ee6c66ba83be64b302d7cba6ce15bb556f4", "d35f3b282f1d5ba23d7cc4c61eb25b985476da5ea487080836ff348a90a6676e53932a4650a62ecf48b6c2a43f3036b9", "4ba46dc9052770b2e0686c3d10dcc284a9824523d131b2e95ae57bb28580e0f45868f94cae551b20111351875bfe9d87", "28821ba5af145b8cfd2650fb6bc13db3f8cd6baef064c30c782fb2061c8d5b4dcd3311684d5ac5a6d2d0f170a94046ce2dbe8e6261", "7b746b4994f2dce38bd9a4960b698b1a1f14176047e485d88d77daa2f376ae0d"),
    ("blake2s-128", "aa4938119b1dc7b87cbad0ffd200d0ae", "a428a91126141be52b305064483d55fd", "167b813fa7c69410833a3d039e8a8c8b", "4fcce7441dd3c96b5e61a97d8315c51ad1a73c4e21", "53844abf4c33c58cd726ad1d8628871657b7f77e0c981f2e5808fea235c2f304"),
    ("blake2s-160", "5ae3b99be29b01834c3b508521ede60438f8de17", "87b48e1e761348b41d9a1a2dfdf32aec3bf7b018", "977fcfb8693fad6b7c8b10454342c94fda3383e4", "bc1aa5bd15a87c92bbf732240ec21de9bfa3258048a3df560e", "28773d7c5e0b2e1bae2c06626b49120a5327cb6185d6f6ac36a2229db6ebe46a"),
    ("blake2s-224", "0b033fc226df7abde29f67a05d3dc62cf271ef3dfea4d387407fbd55", "bcbe27f427954e59bdc939a340e625ccca40dcb3780d3980682109c2", "78d8449b01f2aa9a0e9c482e9d7e79934f06480eedc64ca954edbaa7", "dfad6e76f91b094852178dedd021c63c14ee436062c150baaba051668ef819e658", "690eee72ffa0934f2ea7440a67af8f0498689a70a94de096fdc737799119278e"),
];

fn run(f: impl FnOnce(&mut [u8]), len: usize) -> String {
    let mut out = vec![0u8; len];
    f(&mut out);
    hex::encode(out)
}

#[test]
fn digest_hmac_and_pbkdf2_match_known_answers() {
    for &(name, digest, mac, long_key_mac, pb2, pb1000) in VECTORS {
        let h: HashAlg = name.parse().unwrap();
        let n = h.output_len();
        assert_eq!(n * 2, digest.len(), "{name} output length");
        assert_eq!(run(|o| h.digest_into(&[b"a", b"bc"], o), n), digest, "{name} digest");
        let fox: &[&[u8]] = &[b"The quick brown fox ", b"jumps over the lazy dog"];
        assert_eq!(run(|o| h.hmac(b"key", fox, o), n), mac, "{name} hmac");
        assert_eq!(run(|o| h.hmac(&[b'k'; 200], &[b"msg"], o), n), long_key_mac, "{name} long-key hmac");
        assert_eq!(run(|o| h.pbkdf2(b"password", b"salt", 2, o).unwrap(), n + 5), pb2, "{name} pbkdf2 c=2");
        let (p, s) = (b"passwordPASSWORDpassword", b"saltSALTsaltSALTsaltSALTsaltSALTsalt");
        assert_eq!(run(|o| h.pbkdf2(p, s, 1000, o).unwrap(), 32), pb1000, "{name} pbkdf2 c=1000");
    }
}

/// R 50.1.111-2016 (PBKDF2 with HMAC-Streebog-512).
#[test]
fn pbkdf2_stribog512_r_50_1_111_2016() {
    let h = HashAlg::Stribog512;
    assert_eq!(
        run(|o| h.pbkdf2(b"password", b"salt", 1, o).unwrap(), 64),
        "64770af7f748c3b1c9ac831dbcfd85c26111b30a8a657ddc3056b80ca73e040d\
         2854fd36811f6d825cc4ab66ec0a68a490a9e5cf5156b3a2b7eecddbf9a16b47"
    );
    assert_eq!(
        run(|o| h.pbkdf2(b"password", b"salt", 2, o).unwrap(), 64),
        "5a585bafdfbb6e8830d6d68aa3b43ac00d2e4aebce01c9b31c2caed56f0236d4\
         d34b2b8fbd2c4e89d54d46f50e47d45bbac301571743119e8d3c42ba66d348de"
    );
}

/// The generic HMAC/PBKDF2 path agrees with the `pbkdf2`/`hmac` crates' path on SHA-256.
#[test]
fn generic_pbkdf2_agrees_with_the_crate_path() {
    let mut a = [0u8; 45];
    pbkdf2_generic::<sha2::Sha256>(b"pw", b"salt", 7, &mut a);
    let mut b = [0u8; 45];
    HashAlg::Sha256.pbkdf2(b"pw", b"salt", 7, &mut b).unwrap();
    assert_eq!(a, b);
}

#[test]
fn lengths_and_luks1_eligibility() {
    for &h in HashAlg::ALL {
        assert!(h.output_len() <= 64 && h.output_len() >= 16, "{h}");
        assert!(h.block_len() >= 64, "{h}");
        assert_eq!(h.luks1_allowed(), !matches!(h, HashAlg::Md5 | HashAlg::Md4 | HashAlg::Blake2s128), "{h}");
    }
    assert_eq!(HashAlg::Sha3_256.block_len(), 136);
    assert_eq!(HashAlg::Blake2b160.block_len(), 128);
    assert_eq!(HashAlg::Stribog256.output_len(), 32);
}

#[test]
fn aliases_resolve_and_unknown_hashes_are_refused_by_name() {
    for (alias, h) in [
        ("SHA2-256", HashAlg::Sha256),
        ("rmd160", HashAlg::Ripemd160),
        ("RIPEMD", HashAlg::Ripemd160),
        ("BLAKE2b512", HashAlg::Blake2b512),
        ("Whirlpool", HashAlg::Whirlpool),
        ("sha-512/256", HashAlg::Sha512_256),
    ] {
        assert_eq!(alias.parse::<HashAlg>().unwrap(), h, "{alias}");
    }
    for bad in ["shake128", "mdc2", "crc32", "sha256x", "", "blake2b-511"] {
        let e = bad.parse::<HashAlg>().unwrap_err();
        assert_eq!(e, KdfError::UnsupportedHash(bad.into()));
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
}
