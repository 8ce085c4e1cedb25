/* math: (to be written) */
